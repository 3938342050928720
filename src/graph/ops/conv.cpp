// 2-D convolution layer (NCHW), optional bias; oneDNN on the CPU.
#include "kernels/conv.h"
#include "graph/ops.h"
#include "kernels/elementwise.h"

namespace dtrain::graph {
namespace {

class Conv2d final : public Op {
 public:
  Conv2d(int64_t c, int64_t k, int64_t r, int64_t stride, int64_t pad, int64_t dil, int64_t groups,
         Bias bias, KaimingFan fan)
      : c_(c),
        k_(k),
        r_(r),
        stride_(stride),
        pad_(pad),
        dil_(dil),
        groups_(groups),
        bias_(bias),
        fan_(fan) {}
  std::string_view kind() const override { return "conv2d"; }
  bool skips_param_grad(size_t /*k*/) const override { return true; }
  // oneDNN's blocked layouts here for groups 1; the bias pass is NCHW's.
  BlockedForm blocked_form() const override {
    return groups_ == 1 && bias_ == Bias::no ? BlockedForm::free : BlockedForm::none;
  }

 protected:
  kernels::Conv2dArgs args(const Shape& x) const {
    return {x[0], c_, x[2], x[3], k_, r_, r_, stride_, stride_, pad_, pad_, dil_, dil_, groups_};
  }

  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 4 || x[1] != c_) {
      op_error(kind(), fmt::format("input {} must be [N, {}, H, W]", x.str(), c_));
    }
    const kernels::Conv2dArgs a = args(x);
    if (a.out_h() <= 0 || a.out_w() <= 0) {
      op_error(kind(), fmt::format("input {} is smaller than the {}x{} kernel", x.str(), r_, r_));
    }
    OpInfo info;
    info.outputs = {{{x[0], k_, a.out_h(), a.out_w()}, in[0].dtype}};
    const int64_t fan_in = c_ / groups_ * r_ * r_;
    const int64_t weight_fan = fan_ == KaimingFan::in ? fan_in : k_ * r_ * r_;
    info.params.push_back(
        {"weight", {k_, c_ / groups_, r_, r_}, InitKind::kaiming_normal, 0, weight_fan});
    if (bias_ == Bias::yes) {
      info.params.push_back({"bias", {k_}, InitKind::kaiming_uniform, 0, fan_in, ParamGroup::bias});
    }
    info.workspace_bytes = kernels::conv2d_workspace_bytes(a, in[0].dtype);
    info.cuda_workspace_bytes = kernels::conv2d_workspace_bytes(a, in[0].dtype, Device::cuda());
    info.flops = a.flops();
    return info;
  }

  kernels::Conv2dArgs args(const OpContext& ctx) const {
    kernels::Conv2dArgs a = args(ctx.inputs[0].shape());
    a.math = ctx.math;
    a.x_block = ctx.input_block(0);
    a.y_block = ctx.output_block(0);
    return a;
  }

  void do_forward(OpContext& ctx) const override {
    const kernels::Conv2dArgs a = args(ctx);
    kernels::conv2d_forward(a, ctx.inputs[0], ctx.params[0], ctx.outputs[0], ctx.workspace);
    if (bias_ == Bias::yes) {
      DTRAIN_CHECK(a.y_block == 0, "conv2d: a bias on a channel-blocked output");
      kernels::bias_add({a.n, k_, a.out_h() * a.out_w()}, ctx.outputs[0], ctx.params[1],
                        ctx.outputs[0]);
    }
  }

  // The input is read by the filter gradient alone (backward-data reads the weight).
  Keep keep_skipping(Keep keep, uint32_t skipped) const override {
    return (skipped & 1u) != 0 && keep == Keep::inputs ? Keep::nothing : keep;
  }

  void do_backward(OpContext& ctx) const override {
    const kernels::Conv2dArgs a = args(ctx);
    const Tensor& dy = ctx.grad_outputs[0];
    if (ctx.grad_inputs[0].defined()) {
      kernels::conv2d_backward_data(a, dy, ctx.params[0], ctx.grad_inputs[0], ctx.workspace);
    }
    if (ctx.grad_params[0].defined())
      kernels::conv2d_backward_filter(a, ctx.inputs[0], dy, ctx.grad_params[0], ctx.workspace);
    if (bias_ == Bias::yes && ctx.grad_params[1].defined()) {
      kernels::bias_add_backward({a.n, k_, a.out_h() * a.out_w()}, dy, ctx.grad_params[1]);
    }
  }

 private:
  int64_t c_, k_, r_, stride_, pad_, dil_, groups_;
  Bias bias_;
  KaimingFan fan_;
};

}  // namespace

std::unique_ptr<Op> conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel,
                           int64_t stride, int64_t pad, int64_t dilation, int64_t groups, Bias bias,
                           KaimingFan fan) {
  if (in_channels <= 0 || out_channels <= 0 || kernel <= 0 || stride <= 0 || pad < 0 ||
      dilation <= 0 || groups <= 0 || in_channels % groups || out_channels % groups) {
    op_error("conv2d",
             fmt::format("bad geometry: {} -> {} channels, kernel {}, stride {}, pad {}, "
                         "dilation {}, groups {}",
                         in_channels, out_channels, kernel, stride, pad, dilation, groups));
  }
  return std::make_unique<Conv2d>(in_channels, out_channels, kernel, stride, pad, dilation, groups,
                                  bias, fan);
}

}  // namespace dtrain::graph
