// Pointwise layers: activations, dropout, residual add, flatten.
#include "core/rng.h"
#include "graph/ops.h"
#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"

namespace dtrain::graph {
namespace {

class ActivationOp final : public Op {
 public:
  explicit ActivationOp(kernels::Activation act) : act_(act) {}
  std::string_view kind() const override {
    switch (act_) {
      case kernels::Activation::relu:
        return "relu";
      case kernels::Activation::gelu_tanh:
        return "gelu_tanh";
      case kernels::Activation::gelu_erf:
        return "gelu";
      case kernels::Activation::tanh:
        return "tanh";
    }
    return "activation";
  }
  // ReLU is element-wise and its kernels layout-blind; the others are kept NCHW.
  BlockedForm blocked_form() const override {
    return act_ == kernels::Activation::relu ? BlockedForm::alike : BlockedForm::none;
  }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    OpInfo info;
    info.outputs = {in[0]};
    info.flops = static_cast<double>(in[0].shape.numel());
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    kernels::activation_forward(act_, ctx.inputs[0], ctx.outputs[0]);
  }
  void do_backward(OpContext& ctx) const override {
    kernels::activation_backward(act_, ctx.inputs[0], ctx.grad_outputs[0], ctx.grad_inputs[0]);
  }

 private:
  kernels::Activation act_;
};

constexpr uint32_t kDropoutPurpose = 3;

class Dropout final : public Op {
 public:
  explicit Dropout(float p) : p_(p) {}
  std::string_view kind() const override { return "dropout"; }

 protected:
  // numel: the input's (the mask's, in backward: the input need not be kept).
  kernels::DropoutArgs args(const OpContext& ctx, int64_t numel) const {
    // One stream per (op, step): every step and every layer draw fresh numbers; each
    // sample of the step's global batch owns its own run of words (BatchKey).
    return {p_, ctx.seed, rng_stream_id(kDropoutPurpose, 0, (ctx.step << 16) | ctx.op_index),
            ctx.batch.word_offset(numel)};
  }
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    OpInfo info;
    info.outputs = {in[0]};
    info.saved = {{in[0].shape, DType::u8}};  // the keep mask
    info.keep = Keep::nothing;
    info.flops = static_cast<double>(in[0].shape.numel());
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    if (ctx.mode == Mode::eval || p_ == 0.0f) {  // the identity; backward ignores the mask
      kernels::scale(1.0f, ctx.inputs[0], ctx.outputs[0]);
      return;
    }
    kernels::dropout_forward(args(ctx, ctx.inputs[0].numel()), ctx.inputs[0], ctx.outputs[0],
                             ctx.saved[0]);
  }
  void do_backward(OpContext& ctx) const override {
    if (ctx.mode == Mode::eval || p_ == 0.0f) {
      kernels::scale(1.0f, ctx.grad_outputs[0], ctx.grad_inputs[0]);
      return;
    }
    kernels::dropout_backward(args(ctx, ctx.saved[0].numel()), ctx.grad_outputs[0], ctx.saved[0],
                              ctx.grad_inputs[0]);
  }

 private:
  float p_;
};

// a + b; with relu, relu(a + b) as one op ("add_relu"), whose output is the ReLU's: the
// sum is never stored, and on the CPU (f32, bf16) one pass makes it. Its backward gives each
// input dy where the output is > 0 (where the sum is), else 0: the bits of add then ReLU.
class Add final : public Op {
 public:
  explicit Add(bool relu) : relu_(relu) {}
  std::string_view kind() const override { return relu_ ? "add_relu" : "add"; }
  BlockedForm blocked_form() const override { return BlockedForm::alike; }

 protected:
  int num_inputs() const override { return 2; }
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    if (!(in[0] == in[1])) {
      op_error(kind(), fmt::format("operands differ: {} {} vs {} {}", dtype_name(in[0].dtype),
                                   in[0].shape.str(), dtype_name(in[1].dtype), in[1].shape.str()));
    }
    OpInfo info;
    info.outputs = {in[0]};
    info.keep = relu_ ? Keep::outputs : Keep::nothing;
    info.flops = (relu_ ? 2.0 : 1.0) * static_cast<double>(in[0].shape.numel());
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    const DType t = ctx.inputs[0].dtype();
    if (relu_ && (t == DType::f32 || t == DType::bf16) && ctx.inputs[0].device().is_cpu()) {
      kernels::add_relu(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]);
      return;
    }
    kernels::add(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]);
    if (relu_) {
      kernels::activation_forward(kernels::Activation::relu, ctx.outputs[0], ctx.outputs[0]);
    }
  }
  void do_backward(OpContext& ctx) const override {
    for (Tensor& g : ctx.grad_inputs) {
      if (!g.defined()) continue;
      if (relu_) {
        kernels::activation_backward(kernels::Activation::relu, ctx.outputs[0], ctx.grad_outputs[0],
                                     g);
      } else {
        kernels::scale(1.0f, ctx.grad_outputs[0], g);
      }
    }
  }

 private:
  bool relu_;
};

class Flatten final : public Op {
 public:
  std::string_view kind() const override { return "flatten"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() < 1) op_error(kind(), "input must have a batch dim");
    OpInfo info;
    info.outputs = {{{x[0], x.numel() / std::max<int64_t>(x[0], 1)}, in[0].dtype}};
    info.keep = Keep::nothing;
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    Tensor y = ctx.outputs[0].reshape(ctx.inputs[0].shape());
    kernels::scale(1.0f, ctx.inputs[0], y);
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    Tensor dx = ctx.grad_inputs[0].reshape(ctx.grad_outputs[0].shape());
    kernels::scale(1.0f, ctx.grad_outputs[0], dx);
  }
};

// A floating input converted to the graph's compute dtype (images enter as f32);
// the gradient goes back converted to the input's dtype.
class ToCompute final : public Op {
 public:
  std::string_view kind() const override { return "to_compute_dtype"; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    if (!is_floating(in[0].dtype)) {
      op_error(kind(), fmt::format("input is {}, not floating", dtype_name(in[0].dtype)));
    }
    OpInfo info;
    info.outputs = {{in[0].shape, policy().compute}};
    info.keep = Keep::nothing;
    info.flops = static_cast<double>(in[0].shape.numel());
    return info;
  }
  void do_forward(OpContext& ctx) const override { kernels::cast(ctx.inputs[0], ctx.outputs[0]); }
  void do_backward(OpContext& ctx) const override {
    if (ctx.grad_inputs[0].defined()) kernels::cast(ctx.grad_outputs[0], ctx.grad_inputs[0]);
  }
};

}  // namespace

std::unique_ptr<Op> to_compute_dtype() { return std::make_unique<ToCompute>(); }

std::unique_ptr<Op> activation(kernels::Activation act) {
  return std::make_unique<ActivationOp>(act);
}

std::unique_ptr<Op> dropout(float p) {
  if (!(p >= 0.0f && p < 1.0f)) op_error("dropout", fmt::format("p must be in [0, 1), got {}", p));
  return std::make_unique<Dropout>(p);
}

std::unique_ptr<Op> add() { return std::make_unique<Add>(false); }
std::unique_ptr<Op> add_relu() { return std::make_unique<Add>(true); }
std::unique_ptr<Op> flatten() { return std::make_unique<Flatten>(); }

}  // namespace dtrain::graph
