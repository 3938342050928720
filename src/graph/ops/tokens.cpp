// Token-layout ops of vision and language transformers: patchify (images to a
// sequence of flattened patches, a pure permutation), select_token (one token
// of each sequence, e.g. BERT's [CLS] for the pooler), padding_mask (which tokens
// attention may see) and gather_labeled (the labelled positions of each sequence,
// for BERT's masked-LM head). No arithmetic.
#include "graph/ops.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layout.h"

namespace dtrain::graph {
namespace {

// [N, C, Hp, P, Wp, P] <-> [N, Hp, Wp, C, P, P]
constexpr int kToPatches[6] = {0, 2, 4, 1, 3, 5};
constexpr int kFromPatches[6] = {0, 3, 1, 4, 2, 5};

class Patchify final : public Op {
 public:
  explicit Patchify(int64_t patch) : p_(patch) {}
  std::string_view kind() const override { return "patchify"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 4) op_error(kind(), fmt::format("input {} must be [N, C, H, W]", x.str()));
    if (x[2] % p_ != 0 || x[3] % p_ != 0) {
      op_error(kind(),
               fmt::format("patch size {} does not divide the {}x{} image", p_, x[2], x[3]));
    }
    OpInfo info;
    info.outputs = {{{x[0], (x[2] / p_) * (x[3] / p_), x[1] * p_ * p_}, in[0].dtype}};
    info.keep = Keep::nothing;
    return info;
  }
  Shape image6(const Shape& x) const { return {x[0], x[1], x[2] / p_, p_, x[3] / p_, p_}; }
  Shape patches6(const Shape& x) const { return {x[0], x[2] / p_, x[3] / p_, x[1], p_, p_}; }

  void do_forward(OpContext& ctx) const override {
    const Shape& x = ctx.inputs[0].shape();
    Tensor y = ctx.outputs[0].reshape(patches6(x));
    kernels::permute(ctx.inputs[0].reshape(image6(x)), kToPatches, y);
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    const Shape& x = ctx.inputs[0].shape();
    Tensor dx = ctx.grad_inputs[0].reshape(image6(x));
    kernels::permute(ctx.grad_outputs[0].reshape(patches6(x)), kFromPatches, dx);
  }

 private:
  int64_t p_;
};

class SelectToken final : public Op {
 public:
  explicit SelectToken(int64_t index) : index_(index) {}
  std::string_view kind() const override { return "select_token"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 3 || index_ >= x[1]) {
      op_error(kind(), fmt::format("input {} must be [B, T, C] with T > {}", x.str(), index_));
    }
    OpInfo info;
    info.outputs = {{{x[0], x[2]}, in[0].dtype}};
    info.keep = Keep::nothing;
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    const Tensor& x = ctx.inputs[0];
    const int64_t b = x.dim(0), t = x.dim(1), c = x.dim(2);
    for (int64_t i = 0; i < b; ++i) {
      Tensor y = ctx.outputs[0].view(i * c, {c});
      kernels::scale(1.0f, x.view((i * t + index_) * c, {c}), y);
    }
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    Tensor& dx = ctx.grad_inputs[0];
    const int64_t b = dx.dim(0), t = dx.dim(1), c = dx.dim(2);
    kernels::fill(dx, 0.0f);
    for (int64_t i = 0; i < b; ++i) {
      Tensor row = dx.view((i * t + index_) * c, {c});
      kernels::scale(1.0f, ctx.grad_outputs[0].view(i * c, {c}), row);
    }
  }

 private:
  int64_t index_;
};

class PaddingMask final : public Op {
 public:
  explicit PaddingMask(int32_t pad_id) : pad_id_(pad_id) {}
  std::string_view kind() const override { return "padding_mask"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    if (in[0].shape.rank() != 2 || in[0].dtype != DType::i32) {
      op_error(kind(), fmt::format("needs i32 token ids [B, T], got {} {}", dtype_name(in[0].dtype),
                                   in[0].shape.str()));
    }
    OpInfo info;
    info.outputs = {{in[0].shape, DType::u8}};
    info.keep = Keep::nothing;
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    kernels::padding_mask(ctx.inputs[0], pad_id_, ctx.outputs[0]);
  }
  void do_backward(OpContext&) const override {}  // integer in, integer out

 private:
  int32_t pad_id_;
};

// Rows are gathered through the embedding kernels with x as the table: forward
// copies rows, backward scatter-adds them (deterministic, in id order).
class GatherLabeled final : public Op {
 public:
  GatherLabeled(int64_t rows, int64_t ignore) : rows_(rows), ignore_(ignore) {}
  std::string_view kind() const override { return "gather_labeled"; }

 protected:
  int num_inputs() const override { return 2; }
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    const Shape& y = in[1].shape;
    if (x.rank() != 3 || in[1].dtype != DType::i32 || y != Shape{x[0], x[1]}) {
      op_error(kind(), fmt::format("needs x [B, T, C] and i32 labels [B, T], got {} and {} {}",
                                   x.str(), dtype_name(in[1].dtype), y.str()));
    }
    if (rows_ > x[1]) {
      op_error(kind(),
               fmt::format("{} rows per sequence, but sequences have {} tokens", rows_, x[1]));
    }
    OpInfo info;
    info.outputs = {{{x[0], rows_, x[2]}, in[0].dtype}, {{x[0], rows_}, DType::i32}};
    info.saved = {{{x[0] * rows_}, DType::i32}};  // the gathered row of x, per output row
    info.keep = Keep::nothing;
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    const Tensor& x = ctx.inputs[0];
    const int64_t b = x.dim(0), t = x.dim(1), c = x.dim(2);
    kernels::labeled_rows(ctx.inputs[1], ignore_, ctx.saved[0], ctx.outputs[1]);
    Tensor y = ctx.outputs[0].reshape({b * rows_, c});
    kernels::embedding_forward(ctx.saved[0], x.reshape({b * t, c}), y);
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    Tensor& dx = ctx.grad_inputs[0];
    const int64_t b = dx.dim(0), t = dx.dim(1), c = dx.dim(2);
    kernels::fill(dx, 0.0f);
    Tensor table = dx.reshape({b * t, c});
    kernels::embedding_backward(ctx.saved[0], ctx.grad_outputs[0].reshape({b * rows_, c}), table);
  }

 private:
  int64_t rows_;
  int64_t ignore_;
};

}  // namespace

std::unique_ptr<Op> gather_labeled(int64_t rows, int64_t ignore_index) {
  if (rows < 1) op_error("gather_labeled", fmt::format("rows must be >= 1, got {}", rows));
  return std::make_unique<GatherLabeled>(rows, ignore_index);
}

std::unique_ptr<Op> patchify(int64_t patch) {
  if (patch <= 0) op_error("patchify", fmt::format("patch size must be positive, got {}", patch));
  return std::make_unique<Patchify>(patch);
}

std::unique_ptr<Op> padding_mask(int64_t pad_id) {
  return std::make_unique<PaddingMask>(static_cast<int32_t>(pad_id));
}

std::unique_ptr<Op> select_token(int64_t index) {
  if (index < 0) op_error("select_token", fmt::format("index must be >= 0, got {}", index));
  return std::make_unique<SelectToken>(index);
}

}  // namespace dtrain::graph
