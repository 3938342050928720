// Normalisation layers: batch-norm over [N, C, H, W] (batch statistics in
// training, running statistics in evaluation) and layer-norm over the last dim.
#include "graph/ops.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/layernorm.h"
#include "kernels/memory.h"

namespace dtrain::graph {
namespace {

// With relu: batch norm then ReLU as one op ("batch_norm2d_relu"), whose output is the
// ReLU's: the pre-activation is never stored, and on the CPU (f32, bf16) one pass does both
// (kernels::BatchNormArgs::relu). Elsewhere the two kernels run in turn. Either way the
// bits of the two ops.
class BatchNorm2d final : public Op {
 public:
  BatchNorm2d(int64_t c, float eps, float momentum, InitKind gamma_init, bool relu)
      : c_(c), eps_(eps), momentum_(momentum), gamma_init_(gamma_init), relu_(relu) {}
  std::string_view kind() const override { return relu_ ? "batch_norm2d_relu" : "batch_norm2d"; }
  BlockedForm blocked_form() const override { return BlockedForm::alike; }

 protected:
  kernels::BatchNormArgs args(const Shape& x, int64_t block = 0) const {
    return {x[0], c_, x[2] * x[3], eps_, momentum_, block};
  }
  // The kernel's arguments, with the ReLU fused where the kernel can.
  kernels::BatchNormArgs args(const OpContext& ctx) const {
    kernels::BatchNormArgs a = args(ctx.inputs[0].shape(), ctx.input_block(0));
    a.relu = fused(ctx);
    return a;
  }
  // Forward: f32 and bf16. Backward: f32 (in bf16 the fused backward, converting the
  // kept output at each of its three reads, was slower than the ReLU's pass before it).
  bool fused(const OpContext& ctx) const {
    const DType t = ctx.inputs[0].dtype();
    return relu_ && (t == DType::f32 || t == DType::bf16) && ctx.inputs[0].device().is_cpu();
  }
  bool fused_backward(const OpContext& ctx) const {
    return fused(ctx) && ctx.inputs[0].dtype() == DType::f32;
  }
  // The ReLU after an unfused forward, in place.
  void relu_after(const OpContext& ctx, Tensor& y) const {
    if (relu_ && !fused(ctx)) kernels::activation_forward(kernels::Activation::relu, y, y);
  }

  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 4 || x[1] != c_) {
      op_error(kind(), fmt::format("input {} must be [N, {}, H, W]", x.str(), c_));
    }
    OpInfo info;
    info.outputs = {in[0]};
    info.params = {{"weight", {c_}, gamma_init_, 0, 1, ParamGroup::norm},
                   {"bias", {c_}, InitKind::zeros, 0, 1, ParamGroup::norm}};
    info.buffers = {{"running_mean", {c_}, InitKind::zeros}, {"running_var", {c_}, InitKind::ones}};
    info.saved = {{{c_}, DType::f32}, {{c_}, DType::f32}};  // batch mean, 1/sqrt(var + eps)
    info.writes_input_grad = true;
    info.recompute_temps = {{{c_}, DType::f32}, {{c_}, DType::f32}};
    info.flops = (relu_ ? 9.0 : 8.0) * static_cast<double>(x.numel());
    // The ReLU's backward reads its output (y > 0 exactly where its input is).
    if (relu_) info.keep = Keep::inputs_and_outputs;
    return info;
  }

  void do_forward(OpContext& ctx) const override {
    const kernels::BatchNormArgs a = args(ctx);
    if (ctx.mode == Mode::eval) {
      kernels::batch_norm_forward_infer(a, ctx.inputs[0], ctx.params[0], ctx.params[1],
                                        ctx.buffers[0], ctx.buffers[1], ctx.outputs[0]);
      relu_after(ctx, ctx.outputs[0]);
      return;
    }
    if (ctx.recompute) {  // the same y and statistics; the running averages stay as they are
      Allocator& alloc = kernels::device_allocator(ctx.inputs[0].device());
      Tensor mean = Tensor::empty(ctx.buffers[0].shape(), DType::f32, &alloc);
      Tensor var = Tensor::empty(ctx.buffers[1].shape(), DType::f32, &alloc);
      kernels::copy(ctx.buffers[0], mean);
      kernels::copy(ctx.buffers[1], var);
      kernels::batch_norm_forward_train(a, ctx.inputs[0], ctx.params[0], ctx.params[1],
                                        ctx.outputs[0], mean, var, ctx.saved[0], ctx.saved[1]);
      relu_after(ctx, ctx.outputs[0]);
      return;
    }
    kernels::batch_norm_forward_train(a, ctx.inputs[0], ctx.params[0], ctx.params[1],
                                      ctx.outputs[0], ctx.buffers[0], ctx.buffers[1], ctx.saved[0],
                                      ctx.saved[1]);
    relu_after(ctx, ctx.outputs[0]);
  }

  void do_backward(OpContext& ctx) const override {
    DTRAIN_CHECK(ctx.mode == Mode::train, "batch_norm2d backward after an eval forward");
    Tensor dx = ctx.grad_inputs[0];
    Tensor scratch;
    if (!dx.defined()) {  // the kernel always writes dx; give it somewhere to go
      scratch = Tensor::empty(ctx.inputs[0].shape(), ctx.inputs[0].dtype(),
                              &kernels::device_allocator(ctx.inputs[0].device()));
      dx = scratch;
    }
    kernels::BatchNormArgs a = args(ctx);
    a.relu = fused_backward(ctx);
    Tensor dy = ctx.grad_outputs[0];
    if (relu_ && !a.relu) {
      // The ReLU's backward first, from its output, over dy: nothing reads dy after this
      // op (its readers ran backward before it, and the output it is the gradient of is
      // kept for this op, so no consumer wrote its gradient over that).
      kernels::activation_backward(kernels::Activation::relu, ctx.outputs[0], dy, dy);
    }
    kernels::batch_norm_backward(a, ctx.inputs[0], dy, ctx.params[0], ctx.saved[0], ctx.saved[1],
                                 dx, ctx.grad_params[0], ctx.grad_params[1],
                                 a.relu ? ctx.outputs[0] : Tensor());
  }

 private:
  int64_t c_;
  float eps_, momentum_;
  InitKind gamma_init_;
  bool relu_;
};

class LayerNorm final : public Op {
 public:
  LayerNorm(int64_t c, float eps) : c_(c), eps_(eps) {}
  std::string_view kind() const override { return "layer_norm"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() < 1 || x[-1] != c_) {
      op_error(kind(), fmt::format("input {} must end in {} channels", x.str(), c_));
    }
    const int64_t rows = x.numel() / c_;
    OpInfo info;
    info.outputs = {in[0]};
    info.params = {{"weight", {c_}, InitKind::ones, 0, 1, ParamGroup::norm},
                   {"bias", {c_}, InitKind::zeros, 0, 1, ParamGroup::norm}};
    info.saved = {{{rows}, DType::f32}, {{rows}, DType::f32}};  // mean, 1/sqrt(var + eps)
    info.writes_input_grad = true;
    info.flops = 8.0 * static_cast<double>(x.numel());
    return info;
  }

  void do_forward(OpContext& ctx) const override {
    const kernels::LayerNormArgs a{ctx.inputs[0].numel() / c_, c_, eps_};
    kernels::layer_norm_forward(a, ctx.inputs[0], ctx.params[0], ctx.params[1], ctx.outputs[0],
                                ctx.saved[0], ctx.saved[1]);
  }

  void do_backward(OpContext& ctx) const override {
    const kernels::LayerNormArgs a{ctx.inputs[0].numel() / c_, c_, eps_};
    Tensor dx = ctx.grad_inputs[0];
    Tensor scratch;
    if (!dx.defined()) {
      scratch = Tensor::empty(ctx.inputs[0].shape(), ctx.inputs[0].dtype(),
                              &kernels::device_allocator(ctx.inputs[0].device()));
      dx = scratch;
    }
    kernels::layer_norm_backward(a, ctx.inputs[0], ctx.grad_outputs[0], ctx.params[0], ctx.saved[0],
                                 ctx.saved[1], dx, ctx.grad_params[0], ctx.grad_params[1]);
  }

 private:
  int64_t c_;
  float eps_;
};

}  // namespace

namespace {

std::unique_ptr<Op> make_batch_norm(std::string_view kind, int64_t channels, float eps,
                                    float momentum, InitKind gamma_init, bool relu) {
  if (channels <= 0 || !(eps > 0) || !(momentum >= 0 && momentum <= 1)) {
    op_error(kind, fmt::format("channels {} eps {} momentum {}", channels, eps, momentum));
  }
  if (gamma_init != InitKind::ones && gamma_init != InitKind::zeros) {
    op_error(kind, "gamma can only be initialised to ones or zeros");
  }
  return std::make_unique<BatchNorm2d>(channels, eps, momentum, gamma_init, relu);
}

}  // namespace

std::unique_ptr<Op> batch_norm2d(int64_t channels, float eps, float momentum, InitKind gamma_init) {
  return make_batch_norm("batch_norm2d", channels, eps, momentum, gamma_init, false);
}

std::unique_ptr<Op> batch_norm2d_relu(int64_t channels, float eps, float momentum,
                                      InitKind gamma_init) {
  return make_batch_norm("batch_norm2d_relu", channels, eps, momentum, gamma_init, true);
}

std::unique_ptr<Op> layer_norm(int64_t channels, float eps) {
  if (channels <= 0 || !(eps > 0)) {
    op_error("layer_norm", fmt::format("channels {} eps {}", channels, eps));
  }
  return std::make_unique<LayerNorm>(channels, eps);
}

}  // namespace dtrain::graph
