// Normalisation layers: batch-norm over [N, C, H, W] (batch statistics in
// training, running statistics in evaluation) and layer-norm over the last dim.
#include "graph/ops.h"
#include "kernels/batchnorm.h"
#include "kernels/layernorm.h"
#include "kernels/memory.h"

namespace dtrain::graph {
namespace {

class BatchNorm2d final : public Op {
 public:
  BatchNorm2d(int64_t c, float eps, float momentum, InitKind gamma_init)
      : c_(c), eps_(eps), momentum_(momentum), gamma_init_(gamma_init) {}
  std::string_view kind() const override { return "batch_norm2d"; }

 protected:
  kernels::BatchNormArgs args(const Shape& x, int64_t block = 0) const {
    return {x[0], c_, x[2] * x[3], eps_, momentum_, block};
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
    info.flops = 8.0 * static_cast<double>(x.numel());
    return info;
  }

  void do_forward(OpContext& ctx) const override {
    const kernels::BatchNormArgs a = args(ctx.inputs[0].shape(), ctx.input_block(0));
    if (ctx.mode == Mode::eval) {
      kernels::batch_norm_forward_infer(a, ctx.inputs[0], ctx.params[0], ctx.params[1],
                                        ctx.buffers[0], ctx.buffers[1], ctx.outputs[0]);
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
      return;
    }
    kernels::batch_norm_forward_train(a, ctx.inputs[0], ctx.params[0], ctx.params[1],
                                      ctx.outputs[0], ctx.buffers[0], ctx.buffers[1], ctx.saved[0],
                                      ctx.saved[1]);
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
    kernels::batch_norm_backward(args(ctx.inputs[0].shape(), ctx.input_block(0)), ctx.inputs[0],
                                 ctx.grad_outputs[0], ctx.params[0], ctx.saved[0], ctx.saved[1], dx,
                                 ctx.grad_params[0], ctx.grad_params[1]);
  }

 private:
  int64_t c_;
  float eps_, momentum_;
  InitKind gamma_init_;
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

std::unique_ptr<Op> batch_norm2d(int64_t channels, float eps, float momentum, InitKind gamma_init) {
  if (channels <= 0 || !(eps > 0) || !(momentum >= 0 && momentum <= 1)) {
    op_error("batch_norm2d",
             fmt::format("channels {} eps {} momentum {}", channels, eps, momentum));
  }
  if (gamma_init != InitKind::ones && gamma_init != InitKind::zeros) {
    op_error("batch_norm2d", "gamma can only be initialised to ones or zeros");
  }
  return std::make_unique<BatchNorm2d>(channels, eps, momentum, gamma_init);
}

std::unique_ptr<Op> layer_norm(int64_t channels, float eps) {
  if (channels <= 0 || !(eps > 0)) {
    op_error("layer_norm", fmt::format("channels {} eps {}", channels, eps));
  }
  return std::make_unique<LayerNorm>(channels, eps);
}

}  // namespace dtrain::graph
