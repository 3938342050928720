// Pooling layers: max / average 2-D pooling and global average pooling.
#include "graph/ops.h"
#include "kernels/pooling.h"

namespace dtrain::graph {
namespace {

class Pool2d final : public Op {
 public:
  Pool2d(kernels::PoolKind kind, int64_t k, int64_t s, int64_t p)
      : kind_(kind), k_(k), s_(s), p_(p) {}
  std::string_view kind() const override {
    return kind_ == kernels::PoolKind::max ? "max_pool2d" : "avg_pool2d";
  }
  BlockedForm blocked_form() const override { return BlockedForm::alike; }

 protected:
  kernels::Pool2dArgs args(const Shape& x) const {
    return {x[0], x[1], x[2], x[3], k_, k_, s_, s_, p_, p_, kernels::PadCount::exclude};
  }
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 4) op_error(kind(), fmt::format("input {} must be [N, C, H, W]", x.str()));
    const kernels::Pool2dArgs a = args(x);
    if (a.out_h() <= 0 || a.out_w() <= 0 || 2 * p_ > k_) {
      op_error(kind(), fmt::format("input {} does not fit window {} stride {} pad {}", x.str(), k_,
                                   s_, p_));
    }
    const Shape y{x[0], x[1], a.out_h(), a.out_w()};
    OpInfo info;
    info.outputs = {{y, in[0].dtype}};
    info.saved = {{y, DType::i32}};  // argmax (max pooling); unused by average pooling
    info.keep = Keep::nothing;
    info.flops = static_cast<double>(y.numel() * k_ * k_);
    return info;
  }
  kernels::Pool2dArgs args(const OpContext& ctx) const {
    kernels::Pool2dArgs a = args(ctx.inputs[0].shape());
    a.block = ctx.input_block(0);
    return a;
  }
  void do_forward(OpContext& ctx) const override {
    kernels::pool2d_forward(kind_, args(ctx), ctx.inputs[0], ctx.outputs[0], ctx.saved[0]);
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    kernels::pool2d_backward(kind_, args(ctx), ctx.grad_outputs[0], ctx.saved[0],
                             ctx.grad_inputs[0]);
  }

 private:
  kernels::PoolKind kind_;
  int64_t k_, s_, p_;
};

class GlobalAvgPool final : public Op {
 public:
  std::string_view kind() const override { return "global_avg_pool"; }
  BlockedForm blocked_form() const override { return BlockedForm::reads; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 4) op_error(kind(), fmt::format("input {} must be [N, C, H, W]", x.str()));
    OpInfo info;
    info.outputs = {{{x[0], x[1]}, in[0].dtype}};
    info.keep = Keep::nothing;
    info.flops = static_cast<double>(x.numel());
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    const Shape& x = ctx.inputs[0].shape();
    kernels::global_avg_pool_forward(x[0], x[1], x[2] * x[3], ctx.inputs[0], ctx.outputs[0],
                                     ctx.input_block(0));
  }
  void do_backward(OpContext& ctx) const override {
    if (!ctx.grad_inputs[0].defined()) return;
    const Shape& x = ctx.inputs[0].shape();
    kernels::global_avg_pool_backward(x[0], x[1], x[2] * x[3], ctx.grad_outputs[0],
                                      ctx.grad_inputs[0], ctx.input_block(0));
  }
};

}  // namespace

std::unique_ptr<Op> pool2d(kernels::PoolKind kind, int64_t kernel, int64_t stride, int64_t pad) {
  if (kernel <= 0 || stride <= 0 || pad < 0) {
    op_error("pool2d", fmt::format("kernel {} stride {} pad {}", kernel, stride, pad));
  }
  return std::make_unique<Pool2d>(kind, kernel, stride, pad);
}

std::unique_ptr<Op> global_avg_pool() { return std::make_unique<GlobalAvgPool>(); }

}  // namespace dtrain::graph
