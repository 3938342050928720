// Softmax cross-entropy loss over class logits, with ignore-index and label
// smoothing; the mean over non-ignored rows is the graph's scalar loss. Label
// smoothing is a training target: a Mode::eval forward is plain cross-entropy, so
// evaluations measure the model alike with or without it.
#include "graph/ops.h"
#include "kernels/softmax.h"

#include <optional>

namespace dtrain::graph {
namespace {

class SoftmaxCrossEntropy final : public Op {
 public:
  SoftmaxCrossEntropy(int64_t ignore, float smoothing) : ignore_(ignore), smoothing_(smoothing) {}
  std::string_view kind() const override { return "softmax_cross_entropy"; }

  // Tensor parallelism: logits of classes [begin, begin + count) of total (a
  // vocabulary-parallel head's); the full logits are never gathered.
  std::unique_ptr<Op> tensor_share(const TpShare& share) const override {
    if (share.role != TpRole::vocab || tp_) return nullptr;
    auto op = std::make_unique<SoftmaxCrossEntropy>(*this);
    op->tp_ = share;
    return op;
  }

 protected:
  int num_inputs() const override { return 2; }
  kernels::CrossEntropyArgs args(const Shape& logits, Mode mode) const {
    return {logits.numel() / logits[-1], logits[-1], ignore_,
            mode == Mode::train ? smoothing_ : 0.0f};
  }
  // logits [..., K] and labels [...] (the same leading dims)
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    const Shape& y = in[1].shape;
    bool ok = x.rank() >= 2 && y.rank() == x.rank() - 1 && in[1].dtype == DType::i32;
    for (int i = 0; ok && i < y.rank(); ++i) ok = x[i] == y[i];
    if (!ok) {
      op_error(kind(), fmt::format("needs logits [..., K] and i32 labels [...], got {} and {} {}",
                                   x.str(), dtype_name(in[1].dtype), y.str()));
    }
    OpInfo info;
    info.outputs = {{{1}, DType::f32}};
    info.saved = {{{x.numel() / x[-1]}, DType::f32}};  // row log-sum-exp
    info.grad_in_place = 0;  // dlogits = g (softmax - target), element by element
    info.flops = 4.0 * static_cast<double>(x.numel());
    if (tp_) {  // the row maxima and the row sums, between their all-reduces
      if (x[-1] != tp_->count) {
        op_error(kind(),
                 fmt::format("logits {} must hold this rank's {} classes", x.str(), tp_->count));
      }
      info.workspace_bytes = static_cast<size_t>(x.numel() / x[-1]) * 16 + 128;
    }
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    const kernels::CrossEntropyArgs a = args(ctx.inputs[0].shape(), ctx.mode);
    if (!tp_) {
      kernels::softmax_cross_entropy_forward(a, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                                             ctx.saved[0]);
      return;
    }
    const kernels::ClassShare share{tp_->begin, tp_->total};
    size_t off = 0;
    Tensor row_max = ctx.workspace.tensor(off, {a.rows}, DType::f32);
    Tensor sums = ctx.workspace.tensor(off, {a.rows, 3}, DType::f32);
    kernels::cross_entropy_row_max(a, ctx.inputs[0], row_max);
    tp_->group->all_reduce(row_max, GroupReduce::max);
    kernels::cross_entropy_row_sums(a, share, ctx.inputs[0], ctx.inputs[1], row_max, sums);
    tp_->group->all_reduce(sums, GroupReduce::sum);
    kernels::cross_entropy_finish(a, share, ctx.inputs[1], row_max, sums, ctx.outputs[0],
                                  ctx.saved[0]);
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    const kernels::CrossEntropyArgs a = args(ctx.inputs[0].shape(), Mode::train);
    if (tp_) {
      kernels::cross_entropy_share_backward(a, {tp_->begin, tp_->total}, ctx.inputs[0],
                                            ctx.inputs[1], ctx.saved[0], ctx.grad_outputs[0],
                                            ctx.grad_inputs[0]);
      return;
    }
    kernels::softmax_cross_entropy_backward(a, ctx.inputs[0], ctx.inputs[1], ctx.saved[0],
                                            ctx.grad_outputs[0], ctx.grad_inputs[0]);
  }

 private:
  int64_t ignore_;
  float smoothing_;
  std::optional<TpShare> tp_;
};

}  // namespace

std::unique_ptr<Op> softmax_cross_entropy(int64_t ignore_index, float label_smoothing) {
  if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f)) {
    op_error("softmax_cross_entropy",
             fmt::format("label_smoothing must be in [0, 1), got {}", label_smoothing));
  }
  return std::make_unique<SoftmaxCrossEntropy>(ignore_index, label_smoothing);
}

}  // namespace dtrain::graph
