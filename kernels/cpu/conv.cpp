// CPU 2-D convolution through oneDNN (direct algorithm). The primitives are
// created with format_tag::any, so oneDNN picks its blocked layouts (nChw16c,
// OIhw16i16o...), ~2x faster than plain NCHW on 3x3 layers here; arguments are
// reordered from/to the caller's NCHW/KCRS through workspace buffers, unless the
// caller's activations are already in the primitive's layout (Conv2dArgs::x_block:
// the CPU executor keeps a ResNet's activations so, graph/layouts.h). f16
// (absent from oneDNN 2.6 on CPU), and bf16 where this CPU has no oneDNN bf16 path
// (dense_dnnl.h: bf16_compute), compute in f32 via those same reorders.
#include "kernels/conv.h"

#include "kernels/cpu/dense_dnnl.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {

double Conv2dArgs::flops() const {
  return 2.0 * static_cast<double>(n) * k * out_h() * out_w() * (c / groups) * r * s;
}

namespace {

using namespace dnnl_util;
using tag = dnnl::memory::format_tag;

struct ConvPlan {
  Pass fwd, bwd_data, bwd_filter;
};

std::string describe(const Conv2dArgs& a, DType t) {
  return fmt::format(
      "[x {}x{}x{}x{} w {}x{}x{}x{} stride {},{} pad {},{} dil {},{} groups {} {} blocks {},{}]",
      a.n, a.c, a.h, a.w, a.k, a.c / a.groups, a.r, a.s, a.stride_h, a.stride_w, a.pad_h, a.pad_w,
      a.dilation_h, a.dilation_w, a.groups, dtype_name(t), a.x_block, a.y_block);
}

struct ConvDescs {
  md x_user, w_user, y_user;  // the caller's NCHW / KCRS, its dtype
  md x_any, w_any, y_any;     // any layout, compute dtype
  dnnl::memory::dims stride, dil, pad_l, pad_r;
};

tag activation_tag(int64_t block) {
  return block == 16 ? tag::nChw16c : block == 8 ? tag::nChw8c : tag::nchw;
}

ConvDescs make_descs(const Conv2dArgs& a, DType t) {
  const dt user = to_dnnl(t), comp = compute_type(user);
  const dnnl::memory::dims x{a.n, a.c, a.h, a.w}, y{a.n, a.k, a.out_h(), a.out_w()};
  const dnnl::memory::dims w =
      a.groups == 1 ? dnnl::memory::dims{a.k, a.c, a.r, a.s}
                    : dnnl::memory::dims{a.groups, a.k / a.groups, a.c / a.groups, a.r, a.s};
  const tag wtag = a.groups == 1 ? tag::oihw : tag::goihw;
  // Right padding so oneDNN's output size equals ours exactly (may be below pad_l).
  const int64_t pr_h = (a.out_h() - 1) * a.stride_h + (a.r - 1) * a.dilation_h + 1 - a.h - a.pad_h;
  const int64_t pr_w = (a.out_w() - 1) * a.stride_w + (a.s - 1) * a.dilation_w + 1 - a.w - a.pad_w;
  return ConvDescs{md(x, user, activation_tag(a.x_block)),
                   md(w, user, wtag),
                   md(y, user, activation_tag(a.y_block)),
                   md(x, comp, tag::any),
                   md(w, comp, tag::any),
                   md(y, comp, tag::any),
                   {a.stride_h, a.stride_w},
                   {a.dilation_h - 1, a.dilation_w - 1},
                   {a.pad_h, a.pad_w},
                   {pr_h, pr_w}};
}

using fwd_t = dnnl::convolution_forward;
using bwd_d_t = dnnl::convolution_backward_data;
using bwd_w_t = dnnl::convolution_backward_weights;

// The three primitives of a shape, whatever layout the caller's activations are in.
struct ConvPrims {
  fwd_t::primitive_desc fpd;
  bwd_d_t::primitive_desc dpd;
  bwd_w_t::primitive_desc wpd;
  dnnl::primitive fwd, bwd_d, bwd_w;
};

ConvPrims make_prims(const Conv2dArgs& a, DType t) {
  const ConvDescs d = make_descs(a, t);
  const dnnl::primitive_attr attr = user_scratchpad_attr();
  const auto alg = dnnl::algorithm::convolution_direct;
  ConvPrims p;
  p.fpd = fwd_t::primitive_desc(fwd_t::desc(dnnl::prop_kind::forward_training, alg, d.x_any,
                                            d.w_any, d.y_any, d.stride, d.dil, d.pad_l, d.pad_r),
                                attr, cpu_engine());
  p.dpd = bwd_d_t::primitive_desc(
      bwd_d_t::desc(alg, d.x_any, d.w_any, d.y_any, d.stride, d.dil, d.pad_l, d.pad_r), attr,
      cpu_engine(), p.fpd);
  p.wpd = bwd_w_t::primitive_desc(
      bwd_w_t::desc(alg, d.x_any, d.w_any, d.y_any, d.stride, d.dil, d.pad_l, d.pad_r), attr,
      cpu_engine(), p.fpd);
  p.fwd = fwd_t(p.fpd);
  p.bwd_d = bwd_d_t(p.dpd);
  p.bwd_w = bwd_w_t(p.wpd);
  return p;
}

ConvPlan make_plan(const Conv2dArgs& a, DType t, const ConvPrims& pr) {
  const ConvDescs d = make_descs(a, t);
  ConvPlan p;
  p.fwd = make_pass(pr.fwd, pr.fpd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, ArgDir::in, d.x_user, pr.fpd.src_desc()},
                     {DNNL_ARG_WEIGHTS, ArgDir::in, d.w_user, pr.fpd.weights_desc()},
                     {DNNL_ARG_DST, ArgDir::out, d.y_user, pr.fpd.dst_desc()}});
  p.bwd_data = make_pass(pr.bwd_d, pr.dpd.scratchpad_desc(),
                         {{DNNL_ARG_DIFF_DST, ArgDir::in, d.y_user, pr.dpd.diff_dst_desc()},
                          {DNNL_ARG_WEIGHTS, ArgDir::in, d.w_user, pr.dpd.weights_desc()},
                          {DNNL_ARG_DIFF_SRC, ArgDir::out, d.x_user, pr.dpd.diff_src_desc()}});
  p.bwd_filter =
      make_pass(pr.bwd_w, pr.wpd.scratchpad_desc(),
                {{DNNL_ARG_SRC, ArgDir::in, d.x_user, pr.wpd.src_desc()},
                 {DNNL_ARG_DIFF_DST, ArgDir::in, d.y_user, pr.wpd.diff_dst_desc()},
                 {DNNL_ARG_DIFF_WEIGHTS, ArgDir::out, d.w_user, pr.wpd.diff_weights_desc()}});
  return p;
}

void check_args(const Conv2dArgs& a, DType t) {
  DTRAIN_CHECK(a.n > 0 && a.c > 0 && a.h > 0 && a.w > 0 && a.k > 0 && a.r > 0 && a.s > 0,
               "conv2d: empty size {}", describe(a, t));
  DTRAIN_CHECK(a.groups > 0 && a.c % a.groups == 0 && a.k % a.groups == 0,
               "conv2d: groups {} must divide C {} and K {}", a.groups, a.c, a.k);
  DTRAIN_CHECK(a.stride_h > 0 && a.stride_w > 0 && a.dilation_h > 0 && a.dilation_w > 0 &&
                   a.pad_h >= 0 && a.pad_w >= 0,
               "conv2d: bad stride/dilation/padding {}", describe(a, t));
  DTRAIN_CHECK(a.out_h() > 0 && a.out_w() > 0, "conv2d: empty output {}", describe(a, t));
  for (const auto& [block, channels] : {std::pair{a.x_block, a.c}, std::pair{a.y_block, a.k}}) {
    DTRAIN_CHECK(block == 0 || ((block == 8 || block == 16) && channels % block == 0 &&
                                t != DType::f16 && a.groups == 1),
                 "conv2d: channel block {} needs f32 or bf16, groups 1 and a multiple of it {}",
                 block, describe(a, t));
  }
}

// Plans by shape and layout; the primitives by shape alone (a layout adds reorders only).
const ConvPlan& plan_for(const Conv2dArgs& a, DType t) {
  static Cache<ConvPrims> prims;
  static Cache<ConvPlan> plans;
  check_args(a, t);
  const std::string key = describe(a, t);
  return guarded("conv2d", key, [&]() -> const ConvPlan& {
    return plans.get(key, [&] {
      Conv2dArgs shape = a;
      shape.x_block = shape.y_block = 0;
      return make_plan(a, t, prims.get(describe(shape, t), [&] { return make_prims(shape, t); }));
    });
  });
}

// Shared entry checks: x-like [N,C,H,W], w [K,C/g,R,S], y-like [N,K,OH,OW].
void check_tensors(std::string_view op, const Conv2dArgs& a, const Tensor& x, const Tensor& w,
                   const Tensor& y) {
  same_device(op, {&x, &w, &y});
  DTRAIN_CHECK(!x.device().is_cuda() || (a.x_block == 0 && a.y_block == 0),
               "{}: channel blocks are CPU-only", op);
  require_dtype(op, "x", x, {DType::f32, DType::bf16, DType::f16});
  check_args(a, x.dtype());
  require_dtype(op, "w", w, {x.dtype()});
  require_dtype(op, "y", y, {x.dtype()});
  require_numel(op, "x", x, a.n * a.c * a.h * a.w);
  require_numel(op, "w", w, a.k * (a.c / a.groups) * a.r * a.s);
  require_numel(op, "y", y, a.n * a.k * a.out_h() * a.out_w());
}

}  // namespace

namespace {

// The channel block of a ResNet middle layer's primitive (64 -> 64 channels, 3 x 3,
// 56 x 56) computing in `t`, or 0 where it is neither nChw16c nor nChw8c.
int64_t preferred_block(dt t) {
  const dnnl::memory::dims x{1, 64, 56, 56}, w{64, 64, 3, 3};
  const md any_x(x, t, tag::any), any_w(w, t, tag::any);
  using fwd_t = dnnl::convolution_forward;
  const fwd_t::primitive_desc pd(
      fwd_t::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, any_x,
                  any_w, any_x, {1, 1}, {0, 0}, {1, 1}, {1, 1}),
      cpu_engine());
  for (int64_t b : {16, 8}) {
    if (pd.src_desc() == md(x, t, activation_tag(b)) &&
        pd.dst_desc() == md(x, t, activation_tag(b))) {
      return b;
    }
  }
  return 0;
}

}  // namespace

int64_t cpu_channel_block() {
  static const int64_t block = preferred_block(dt::f32);
  return block;
}

int64_t cpu_channel_block(DType dtype) {
  if (dtype == DType::f32) return cpu_channel_block();
  if (dtype != DType::bf16) return 0;
  // Only where oneDNN computes in bf16 and its bf16 primitives want the f32 ones' block.
  // A probe oneDNN refuses means none (every CPU executor asks, f32 ones too).
  static const bool ok = [] {
    try {
      return cpu_channel_block() > 0 && bf16_compute() &&
             preferred_block(dt::bf16) == cpu_channel_block();
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok ? cpu_channel_block() : 0;
}

size_t conv2d_workspace_bytes(const Conv2dArgs& args, DType dtype, Device device) {
  if (device.is_cuda()) {
    check_args(args, dtype);
    DTRAIN_CHECK(args.x_block == 0 && args.y_block == 0, "conv2d: channel blocks are CPU-only");
    return cuda_ops::kConvWorkspaceBytes;
  }
  // The most any layout the executor may pass needs (graph/layouts.h): NCHW, or x / y
  // in this CPU's channel block where their channels allow.
  const int64_t b = cpu_channel_block(dtype);
  const bool can = b > 0 && args.groups == 1;
  size_t bytes = 0;
  for (const int64_t xb : {int64_t{0}, can && args.c % b == 0 ? b : int64_t{-1}}) {
    for (const int64_t yb : {int64_t{0}, can && args.k % b == 0 ? b : int64_t{-1}}) {
      if (xb < 0 || yb < 0) continue;
      Conv2dArgs a = args;
      a.x_block = xb;
      a.y_block = yb;
      const ConvPlan& p = plan_for(a, dtype);
      bytes = std::max(
          {bytes, p.fwd.workspace_bytes, p.bwd_data.workspace_bytes, p.bwd_filter.workspace_bytes});
    }
  }
  return bytes;
}

void conv2d_forward(const Conv2dArgs& args, const Tensor& x, const Tensor& w, Tensor& y,
                    Workspace ws) {
  check_tensors("conv2d_forward", args, x, w, y);
  if (x.device().is_cuda()) return cuda_ops::conv2d_forward(args, x, w, y, ws);
  const ConvPlan& p = plan_for(args, x.dtype());
  guarded("conv2d_forward", describe(args, x.dtype()), [&] {
    run_pass(p.fwd, {x.raw(), w.raw(), y.raw()}, ws);
  });
}

void conv2d_backward_data(const Conv2dArgs& args, const Tensor& dy, const Tensor& w, Tensor& dx,
                          Workspace ws) {
  check_tensors("conv2d_backward_data", args, dx, w, dy);
  if (dy.device().is_cuda()) return cuda_ops::conv2d_backward_data(args, dy, w, dx, ws);
  const ConvPlan& p = plan_for(args, dy.dtype());
  guarded("conv2d_backward_data", describe(args, dy.dtype()), [&] {
    run_pass(p.bwd_data, {dy.raw(), w.raw(), dx.raw()}, ws);
  });
}

void conv2d_backward_filter(const Conv2dArgs& args, const Tensor& x, const Tensor& dy, Tensor& dw,
                            Workspace ws) {
  check_tensors("conv2d_backward_filter", args, x, dw, dy);
  if (x.device().is_cuda()) return cuda_ops::conv2d_backward_filter(args, x, dy, dw, ws);
  const ConvPlan& p = plan_for(args, x.dtype());
  guarded("conv2d_backward_filter", describe(args, x.dtype()), [&] {
    run_pass(p.bwd_filter, {x.raw(), dy.raw(), dw.raw()}, ws);
  });
}

}  // namespace dtrain::kernels
