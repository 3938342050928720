// Linear (fully connected) layer: y = x W^T + b over the last dim of x; the bias
// is the GEMM's epilogue (one pass over y instead of two), and so is a following
// tanh-GELU in linear_gelu (backward: dz = gelu'(z) dy from the saved z, then the
// linear backward on dz).
// Tensor parallelism (graph/tensor_share.h): a column share holds some output
// features (all-reducing the input gradient in backward), a row share some input
// features (all-reducing the output before its bias in forward).
// The weight's gradient is one GEMM straight into its f32 gradient, also for a half
// weight (bf16 / f16 products summed in f32 and written as they are, never rounded to
// the half type) and adding into what is there for a tied weight's later user.
#include <optional>

#include "graph/ops.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/memory.h"

namespace dtrain::graph {
namespace {

class Linear final : public Op {
 public:
  Linear(int64_t in, int64_t out, Bias bias, std::optional<NormalInit> init, bool gelu)
      : in_(in), out_(out), fan_in_(in), bias_(bias), init_(init), gelu_(gelu) {}
  std::string_view kind() const override { return gelu_ ? "linear_gelu" : "linear"; }
  bool can_accumulate_param_grad(size_t k) const override { return k == 0; }
  bool skips_param_grad(size_t /*k*/) const override { return true; }
  bool param_grad_in_f32(size_t k) const override { return k == 0; }

  std::unique_ptr<Op> tensor_share(const TpShare& share) const override {
    if (tp_) return nullptr;
    auto op = std::make_unique<Linear>(*this);
    op->tp_ = share;
    if (share.role == TpRole::column || share.role == TpRole::vocab) {
      if (share.total * share.chunks != out_) return nullptr;
      op->out_ = share.count * share.chunks;
      op->tp_->role = TpRole::column;
    } else if (share.role == TpRole::row && !gelu_ && share.total == in_) {
      op->in_ = share.count;
    } else {
      return nullptr;
    }
    return op;
  }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() < 1 || x[-1] != in_) {
      op_error(kind(), fmt::format("input {} must end in {} features", x.str(), in_));
    }
    Shape y = x;
    y[-1] = out_;
    OpInfo info;
    info.outputs = {{y, in[0].dtype}};
    // Kaiming's fan is the whole layer's, so a share initialises as its part of it.
    if (init_) {
      info.params.push_back({"weight", {out_, in_}, InitKind::normal, init_->std, fan_in_});
    } else {
      info.params.push_back({"weight", {out_, in_}, InitKind::kaiming_uniform, 0, fan_in_});
    }
    if (bias_ == Bias::yes) {
      const InitKind b = init_ ? InitKind::zeros : InitKind::kaiming_uniform;
      info.params.push_back({"bias", {out_}, b, 0, fan_in_, ParamGroup::bias});
    }
    if (tp_ && tp_->role == TpRole::column) {  // output features: the weight's rows, the bias
      for (ParamSpec& p : info.params)
        p.split = {0, tp_->total * tp_->chunks, tp_->begin, tp_->chunks};
    } else if (tp_) {  // row: the weight's columns; the bias is added once, after the sum
      info.params[0].split = {1, tp_->total, tp_->begin, 1};
    }
    info.flops = 2.0 * static_cast<double>(x.numel()) * static_cast<double>(out_);
    if (gelu_) {
      info.saved = {{y, in[0].dtype}};           // the pre-activation x W^T + b
      info.backward_temps = {{y, in[0].dtype}};  // its gradient
    }
    const int64_t rows = x.numel() / in_;
    const DType dt = in[0].dtype;
    kernels::GemmArgs added = bwd_weight(rows);  // a tied weight's later user adds
    added.beta = 1.0f;
    const struct {
      kernels::GemmArgs g;
      DType c;
    } gemms[] = {{fwd(rows), dt},
                 {bwd_data(rows), dt},
                 {bwd_weight(rows), DType::f32},  // the f32 weight gradient
                 {added, DType::f32}};
    for (const auto& [g, c] : gemms) {
      info.workspace_bytes =
          std::max(info.workspace_bytes, kernels::gemm_workspace_bytes(g, dt, c));
      info.cuda_workspace_bytes = std::max(info.cuda_workspace_bytes,
                                           kernels::gemm_workspace_bytes(g, dt, c, Device::cuda()));
    }
    return info;
  }

  // y [rows, out] = x [rows, in] . W^T (+ b, fused into the GEMM)
  kernels::GemmArgs fwd(int64_t rows) const {
    kernels::GemmArgs g{kernels::Trans::no, kernels::Trans::yes, rows, out_, in_};
    if (bias_ == Bias::yes && !row()) g.epilogue = kernels::Epilogue::bias;
    if (gelu_) g.epilogue = kernels::Epilogue::bias_gelu;
    return g;
  }
  // dx [rows, in] = dy [rows, out] . W [out, in]
  kernels::GemmArgs bwd_data(int64_t rows) const {
    return {kernels::Trans::no, kernels::Trans::no, rows, in_, out_};
  }
  // dW [out, in] = dy^T [out, rows] . x [rows, in]
  kernels::GemmArgs bwd_weight(int64_t rows) const {
    return {kernels::Trans::yes, kernels::Trans::no, out_, in_, rows};
  }

  static kernels::GemmArgs with_math(kernels::GemmArgs g, const OpContext& ctx) {
    g.math = ctx.math;
    return g;
  }

  bool row() const { return tp_ && tp_->role == TpRole::row; }

  void do_forward(OpContext& ctx) const override {
    const int64_t rows = ctx.inputs[0].numel() / in_;
    const Tensor no_bias;
    kernels::gemm(with_math(fwd(rows), ctx), ctx.inputs[0], ctx.params[0], ctx.outputs[0],
                  ctx.workspace, bias_ == Bias::yes && !row() ? ctx.params[1] : no_bias,
                  gelu_ ? ctx.saved[0] : no_bias);
    if (!row()) return;
    tp_->group->all_reduce(ctx.outputs[0], GroupReduce::sum);
    if (bias_ == Bias::yes)
      kernels::bias_add({rows, out_, 1}, ctx.outputs[0], ctx.params[1], ctx.outputs[0]);
  }

  // The input is read by the weight gradient alone (the input gradient reads the
  // weight, the bias gradient dy; linear_gelu's pre-activation is a saved tensor).
  Keep keep_skipping(Keep keep, uint32_t skipped) const override {
    return (skipped & 1u) != 0 && keep == Keep::inputs ? Keep::nothing : keep;
  }

  void do_backward(OpContext& ctx) const override {
    const int64_t rows = ctx.inputs[0].numel() / in_;
    Tensor dz;  // linear_gelu: the gradient at the pre-activation
    if (gelu_) {
      const Tensor& z = ctx.saved[0];
      dz = Tensor::empty(z.shape(), z.dtype(), &kernels::device_allocator(z.device()));
      kernels::activation_backward(kernels::Activation::gelu_tanh, z, ctx.grad_outputs[0], dz);
    }
    const Tensor& dy = gelu_ ? dz : ctx.grad_outputs[0];
    if (ctx.grad_inputs[0].defined()) {
      kernels::gemm(with_math(bwd_data(rows), ctx), dy, ctx.params[0], ctx.grad_inputs[0],
                    ctx.workspace);
      // A column share's input gradient is its features' part of the sum.
      if (tp_ && !row()) tp_->group->all_reduce(ctx.grad_inputs[0], GroupReduce::sum);
    }
    if (ctx.grad_params[0].defined()) {
      kernels::GemmArgs dw = with_math(bwd_weight(rows), ctx);
      if (ctx.accumulates(0)) dw.beta = 1.0f;  // a tied weight: added to the other user's
      kernels::gemm(dw, dy, ctx.inputs[0], ctx.grad_params[0], ctx.workspace);
    }
    if (bias_ == Bias::yes && ctx.grad_params[1].defined())
      kernels::bias_add_backward({rows, out_, 1}, dy, ctx.grad_params[1]);
  }

 private:
  int64_t in_, out_;
  int64_t fan_in_;  // the whole layer's input features
  Bias bias_;
  std::optional<NormalInit> init_;
  bool gelu_;
  std::optional<TpShare> tp_;
};

}  // namespace

namespace {

std::unique_ptr<Op> make_linear(int64_t in, int64_t out, Bias bias, std::optional<NormalInit> init,
                                bool gelu = false) {
  if (in <= 0 || out <= 0) {
    op_error("linear", fmt::format("features must be positive, got {} -> {}", in, out));
  }
  if (init && !(init->std > 0)) {
    op_error("linear", fmt::format("init std must be positive, got {}", init->std));
  }
  return std::make_unique<Linear>(in, out, bias, init, gelu);
}

}  // namespace

std::unique_ptr<Op> linear(int64_t in_features, int64_t out_features, Bias bias) {
  return make_linear(in_features, out_features, bias, std::nullopt);
}

std::unique_ptr<Op> linear(int64_t in_features, int64_t out_features, Bias bias, NormalInit init) {
  return make_linear(in_features, out_features, bias, init);
}

std::unique_ptr<Op> linear_gelu(int64_t in_features, int64_t out_features, NormalInit init) {
  return make_linear(in_features, out_features, Bias::yes, init, true);
}

}  // namespace dtrain::graph
