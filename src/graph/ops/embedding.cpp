// Learned embeddings of transformer inputs: token + position (+ token-type)
// embeddings of id sequences (BERT, GPT-2), and the class token + positions of
// a ViT's patch sequence. Positions are "bias rows": position t's row is added
// to every sample's token t, so its gradient is a sum over the batch.
#include "kernels/embedding.h"
#include "graph/ops.h"
#include "kernels/elementwise.h"

#include <optional>

namespace dtrain::graph {
namespace {

class TokenEmbedding final : public Op {
 public:
  TokenEmbedding(const EmbeddingDims& dims, TypeIds type_ids) : d_(dims), type_ids_(type_ids) {}
  std::string_view kind() const override { return "token_embedding"; }
  // The word table's gradient is a scatter-add: it can go on top of a tied output
  // layer's contribution (BERT's decoder, GPT-2's head) instead of into a temporary.
  bool can_accumulate_param_grad(size_t k) const override { return k == 0; }
  // A half word table's gradient goes into the f32 gradient itself (kernels::
  // embedding_backward adds half rows into an f32 table): no temporary of the table's
  // size in its dtype, and none in f32 to widen it through. Not the vocabulary share.
  bool param_grad_in_f32(size_t k) const override { return k == 0 && !tp_; }
  bool skips_param_grad(size_t /*k*/) const override { return true; }

  // Tensor parallelism: word-table rows [begin, begin + count) of the vocabulary; each
  // rank looks up its own ids (zeros for the others') and the rows meet in one sum.
  std::unique_ptr<Op> tensor_share(const TpShare& share) const override {
    if (share.role != TpRole::vocab || tp_ || share.total != d_.vocab) return nullptr;
    auto op = std::make_unique<TokenEmbedding>(*this);
    op->tp_ = share;
    return op;
  }

 protected:
  int num_inputs() const override { return type_ids_ == TypeIds::input ? 2 : 1; }

  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& ids = in[0].shape;
    if (ids.rank() != 2 || in[0].dtype != DType::i32) {
      op_error(kind(), fmt::format("ids must be i32 [B, T], got {} {}", dtype_name(in[0].dtype),
                                   ids.str()));
    }
    if (ids[1] > d_.positions) {
      op_error(kind(),
               fmt::format("{} tokens but only {} position embeddings", ids[1], d_.positions));
    }
    if (type_ids_ == TypeIds::input && (!(in[1] == in[0]))) {
      op_error(kind(), fmt::format("type ids must be i32 {}, got {} {}", ids.str(),
                                   dtype_name(in[1].dtype), in[1].shape.str()));
    }
    const int64_t n = ids.numel(), c = d_.channels;
    OpInfo info;
    const DType dt = policy().compute;
    info.outputs = {{{ids[0], ids[1], c}, dt}};
    auto table = [&](const char* name, int64_t rows) {
      info.params.push_back(
          {name, {rows, c}, InitKind::normal, d_.init_std, 1, ParamGroup::embedding});
    };
    table("word_embeddings.weight", tp_ ? tp_->count : d_.vocab);
    if (tp_) info.params[0].split = {0, d_.vocab, tp_->begin, 1};
    table("position_embeddings.weight", d_.positions);
    if (d_.types > 0) table("token_type_embeddings.weight", d_.types);
    if (type_ids_ == TypeIds::input) {
      info.workspace_bytes = info.cuda_workspace_bytes =
          static_cast<size_t>(n * c) * dtype_size(dt);
    }
    info.flops = static_cast<double>(n * c) * (d_.types > 0 ? 2.0 : 1.0);
    return info;
  }

  void do_forward(OpContext& ctx) const override {
    const int64_t b = ctx.inputs[0].dim(0), t = ctx.inputs[0].dim(1), c = d_.channels;
    Tensor y = ctx.outputs[0].reshape({b * t, c});
    if (tp_) {  // x + 0 = x: the sum is exactly the one-rank lookup
      kernels::embedding_forward_share(ctx.inputs[0].reshape({b * t}), ctx.params[0], tp_->begin,
                                       d_.vocab, y);
      tp_->group->all_reduce(y, GroupReduce::sum);
    } else {
      kernels::embedding_forward(ctx.inputs[0].reshape({b * t}), ctx.params[0], y);
    }
    kernels::bias_add({b, t * c, 1}, y, ctx.params[1].view(0, {t * c}), y);
    if (d_.types == 0) return;
    if (type_ids_ == TypeIds::none) {  // every token is type 0
      kernels::bias_add({b * t, c, 1}, y, ctx.params[2].view(0, {c}), y);
      return;
    }
    size_t off = 0;
    Tensor rows = ctx.workspace.tensor(off, {b * t, c}, y.dtype());
    kernels::embedding_forward(ctx.inputs[1].reshape({b * t}), ctx.params[2], rows);
    kernels::add(y, rows, y);
  }

  void do_backward(OpContext& ctx) const override {
    const int64_t b = ctx.inputs[0].dim(0), t = ctx.inputs[0].dim(1), c = d_.channels;
    const Tensor dy = ctx.grad_outputs[0].reshape({b * t, c});
    if (!ctx.grad_params[0].defined()) {  // frozen
    } else if (tp_) {
      if (!ctx.accumulates(0)) kernels::fill(ctx.grad_params[0], 0.0f);
      kernels::embedding_backward_share(ctx.inputs[0].reshape({b * t}), dy, tp_->begin, d_.vocab,
                                        ctx.grad_params[0]);
    } else {
      if (!ctx.accumulates(0)) kernels::fill(ctx.grad_params[0], 0.0f);
      kernels::embedding_backward(ctx.inputs[0].reshape({b * t}), dy, ctx.grad_params[0]);
    }
    if (ctx.grad_params[1].defined()) {
      kernels::fill(ctx.grad_params[1], 0.0f);  // rows t >= T stay 0
      Tensor dpos = ctx.grad_params[1].view(0, {t * c});
      kernels::bias_add_backward({b, t * c, 1}, dy, dpos);
    }
    if (d_.types == 0 || !ctx.grad_params[2].defined()) return;
    kernels::fill(ctx.grad_params[2], 0.0f);
    if (type_ids_ == TypeIds::none) {
      Tensor dtype0 = ctx.grad_params[2].view(0, {c});
      kernels::bias_add_backward({b * t, c, 1}, dy, dtype0);
      return;
    }
    kernels::embedding_backward(ctx.inputs[1].reshape({b * t}), dy, ctx.grad_params[2]);
  }

 private:
  EmbeddingDims d_;
  TypeIds type_ids_;
  std::optional<TpShare> tp_;
};

class ClassTokenPositions final : public Op {
 public:
  ClassTokenPositions(int64_t tokens, int64_t channels, double init_std)
      : t_(tokens), c_(channels), init_std_(init_std) {}
  std::string_view kind() const override { return "class_token_positions"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    const DType dt = policy().compute;
    if (x.rank() != 3 || x[1] != t_ || x[2] != c_ || in[0].dtype != dt) {
      op_error(kind(), fmt::format("input {} {} must be {} [N, {}, {}]", dtype_name(in[0].dtype),
                                   x.str(), dtype_name(dt), t_, c_));
    }
    OpInfo info;
    info.outputs = {{{x[0], t_ + 1, c_}, dt}};
    info.params = {{"class_token", {c_}, InitKind::zeros, 0, 1, ParamGroup::embedding},
                   {"position_embeddings",
                    {t_ + 1, c_},
                    InitKind::normal,
                    init_std_,
                    1,
                    ParamGroup::embedding}};
    info.keep = Keep::nothing;
    info.flops = static_cast<double>(x[0] * (t_ + 1) * c_);
    return info;
  }

  void do_forward(OpContext& ctx) const override {
    const int64_t n = ctx.inputs[0].dim(0), row = (t_ + 1) * c_;
    for (int64_t i = 0; i < n; ++i) {
      Tensor cls = ctx.outputs[0].view(i * row, {c_});
      kernels::scale(1.0f, ctx.params[0], cls);
      Tensor rest = ctx.outputs[0].view(i * row + c_, {t_ * c_});
      kernels::scale(1.0f, ctx.inputs[0].view(i * t_ * c_, {t_ * c_}), rest);
    }
    kernels::bias_add({n, row, 1}, ctx.outputs[0], ctx.params[1].reshape({row}), ctx.outputs[0]);
  }

  void do_backward(OpContext& ctx) const override {
    const int64_t n = ctx.inputs[0].dim(0), row = (t_ + 1) * c_;
    const Tensor& dy = ctx.grad_outputs[0];
    Tensor dpos = ctx.grad_params[1].reshape({row});
    kernels::bias_add_backward({n, row, 1}, dy, dpos);
    // The class token sits at position 0 of every sample: its gradient is dpos row 0.
    kernels::scale(1.0f, dpos.view(0, {c_}), ctx.grad_params[0]);
    if (!ctx.grad_inputs[0].defined()) return;
    for (int64_t i = 0; i < n; ++i) {
      Tensor dx = ctx.grad_inputs[0].view(i * t_ * c_, {t_ * c_});
      kernels::scale(1.0f, dy.view(i * row + c_, {t_ * c_}), dx);
    }
  }

 private:
  int64_t t_, c_;
  double init_std_;
};

}  // namespace

std::unique_ptr<Op> token_embedding(const EmbeddingDims& dims, TypeIds type_ids) {
  if (dims.vocab <= 0 || dims.positions <= 0 || dims.types < 0 || dims.channels <= 0 ||
      !(dims.init_std > 0)) {
    op_error("token_embedding",
             fmt::format("vocab {} positions {} types {} channels {} init std {}", dims.vocab,
                         dims.positions, dims.types, dims.channels, dims.init_std));
  }
  if (type_ids == TypeIds::input && dims.types == 0) {
    op_error("token_embedding", "type ids given but there is no token-type table (types = 0)");
  }
  return std::make_unique<TokenEmbedding>(dims, type_ids);
}

std::unique_ptr<Op> class_token_positions(int64_t tokens, int64_t channels, double init_std) {
  if (tokens <= 0 || channels <= 0 || !(init_std > 0)) {
    op_error("class_token_positions",
             fmt::format("tokens {} channels {} init std {}", tokens, channels, init_std));
  }
  return std::make_unique<ClassTokenPositions>(tokens, channels, init_std);
}

}  // namespace dtrain::graph
