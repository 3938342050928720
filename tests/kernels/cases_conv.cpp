// Kernel-table cases for conv2d: 3x3 pad 1, stride 2, dilation 2, groups,
// depthwise, 1x1, the 7x7 s2 p3 ResNet stem, rectangular kernels and odd
// spatial sizes. Forward cases run in grad mode through backward-data and
// backward-filter (f32); half dtypes also check both backward passes directly.
#include "harness.h"
#include "kernels/conv.h"
#include "ref/conv.h"

namespace dtrain::test {
namespace {

using kernels::Conv2dArgs;

Conv2dArgs conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s,
                int64_t stride = 1, int64_t pad = 0, int64_t dil = 1, int64_t groups = 1) {
  Conv2dArgs a;
  a.n = n, a.c = c, a.h = h, a.w = w, a.k = k, a.r = r, a.s = s;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = pad;
  a.dilation_h = a.dilation_w = dil;
  a.groups = groups;
  return a;
}

Shape x_shape(const Conv2dArgs& a) { return {a.n, a.c, a.h, a.w}; }
Shape w_shape(const Conv2dArgs& a) { return {a.k, a.c / a.groups, a.r, a.s}; }
Shape y_shape(const Conv2dArgs& a) { return {a.n, a.k, a.out_h(), a.out_w()}; }

Tolerance tolerance(DType t) {
  if (t == DType::bf16) return {3e-2, 1e-2};
  if (t == DType::f16) return {5e-3, 2e-3};
  return {1e-4, 1e-4};
}

std::string tag(const Conv2dArgs& a) {
  return fmt::format("{}x{}x{}x{}_k{}_{}x{}_s{}x{}_p{}x{}_d{}_g{}", a.n, a.c, a.h, a.w, a.k, a.r,
                     a.s, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dilation_h, a.groups);
}

KernelCase forward_case(const std::string& variant, const Conv2dArgs& a, DType t, bool grad) {
  KernelCase c;
  c.name = fmt::format("conv/{}/{}/{}", variant, dtype_name(t), tag(a));
  c.inputs = {{"x", x_shape(a), t}, {"w", w_shape(a), t}};
  c.outputs = {{"y", y_shape(a), t}};
  c.workspace_bytes = kernels::conv2d_workspace_bytes(a, t);
  c.workspace_on = [a, t](Device d) { return kernels::conv2d_workspace_bytes(a, t, d); };
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace ws) {
    kernels::conv2d_forward(a, in[0], in[1], out[0], ws);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::conv2d_forward(a, in[0].data(), in[1].data(), out[0].data());
  };
  if (grad) {
    c.backward = [a](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace ws) {
      kernels::conv2d_backward_data(a, dout[0], in[1], din[0], ws);
      kernels::conv2d_backward_filter(a, in[0], dout[0], din[1], ws);
    };
  }
  c.check_tol = tolerance(t);
  c.grad_tol = {1e-3, 1e-3};
  return c;
}

// Backward passes checked directly against the reference (covers half dtypes).
KernelCase backward_data_case(const Conv2dArgs& a, DType t) {
  KernelCase c;
  c.name = fmt::format("conv/bwd_data/{}/{}", dtype_name(t), tag(a));
  c.inputs = {{"dy", y_shape(a), t}, {"w", w_shape(a), t}};
  c.outputs = {{"dx", x_shape(a), t}};
  c.workspace_bytes = kernels::conv2d_workspace_bytes(a, t);
  c.workspace_on = [a, t](Device d) { return kernels::conv2d_workspace_bytes(a, t, d); };
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace ws) {
    kernels::conv2d_backward_data(a, in[0], in[1], out[0], ws);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::conv2d_backward_data(a, in[0].data(), in[1].data(), out[0].data());
  };
  c.check_tol = tolerance(t);
  return c;
}

KernelCase backward_filter_case(const Conv2dArgs& a, DType t) {
  KernelCase c;
  c.name = fmt::format("conv/bwd_filter/{}/{}", dtype_name(t), tag(a));
  c.inputs = {{"x", x_shape(a), t}, {"dy", y_shape(a), t}};
  c.outputs = {{"dw", w_shape(a), t}};
  c.workspace_bytes = kernels::conv2d_workspace_bytes(a, t);
  c.workspace_on = [a, t](Device d) { return kernels::conv2d_workspace_bytes(a, t, d); };
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace ws) {
    kernels::conv2d_backward_filter(a, in[0], in[1], out[0], ws);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::conv2d_backward_filter(a, in[0].data(), in[1].data(), out[0].data());
  };
  c.check_tol = tolerance(t);
  // Sums over N*OH*OW products: looser for half outputs.
  if (t != DType::f32) c.check_tol = {c.check_tol.atol * 4, c.check_tol.rtol};
  return c;
}

}  // namespace

std::vector<KernelCase> cases_conv() {
  std::vector<KernelCase> cases;
  const DType f32 = DType::f32;
  // Small shapes: forward check + grad (backward-data and backward-filter).
  cases.push_back(forward_case("3x3_pad1", conv(2, 3, 7, 9, 4, 3, 3, 1, 1), f32, true));
  cases.push_back(forward_case("3x3_stride2", conv(2, 4, 9, 8, 5, 3, 3, 2, 1), f32, true));
  cases.push_back(forward_case("3x3_dil2", conv(1, 3, 11, 10, 4, 3, 3, 1, 2, 2), f32, true));
  cases.push_back(forward_case("groups2", conv(2, 4, 7, 7, 6, 3, 3, 1, 1, 1, 2), f32, true));
  cases.push_back(forward_case("depthwise", conv(2, 8, 9, 9, 8, 3, 3, 1, 1, 1, 8), f32, true));
  cases.push_back(forward_case("depthwise_s2", conv(1, 6, 9, 7, 6, 3, 3, 2, 1, 1, 6), f32, true));
  cases.push_back(forward_case("1x1", conv(2, 16, 5, 7, 8, 1, 1), f32, true));
  cases.push_back(forward_case("1x1_stride2", conv(2, 8, 7, 7, 16, 1, 1, 2), f32, true));
  cases.push_back(forward_case("7x7_stem", conv(1, 3, 17, 15, 8, 7, 7, 2, 3), f32, true));
  cases.push_back(forward_case("size1", conv(1, 1, 1, 1, 1, 1, 1), f32, true));
  Conv2dArgs rect = conv(2, 3, 6, 11, 4, 1, 3);
  rect.stride_w = 2, rect.pad_w = 1;
  cases.push_back(forward_case("rect", rect, f32, true));
  // Channel counts oneDNN blocks (multiples of 16): forward and both backward passes.
  const Conv2dArgs blocked = conv(4, 32, 14, 13, 32, 3, 3, 1, 1);
  const Conv2dArgs blocked_s2 = conv(2, 32, 15, 15, 48, 3, 3, 2, 1);
  const Conv2dArgs blocked_dw = conv(2, 32, 9, 11, 32, 3, 3, 1, 1, 1, 32);
  // Backward-filter's fixed cut (kernels/cpu/conv.cpp, FilterTasks): 2 chunks of 4 images
  // times 2 slices of 64 output channels; 1 chunk of 2 slices.
  const Conv2dArgs chunks_slices = conv(8, 16, 8, 8, 128, 3, 3, 1, 1);
  const Conv2dArgs slices = conv(3, 32, 5, 5, 128, 3, 3, 1, 1);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (const Conv2dArgs& a : {chunks_slices, slices}) {
      cases.push_back(backward_filter_case(a, t));
    }
    for (const Conv2dArgs& a : {blocked, blocked_s2, blocked_dw}) {
      cases.push_back(forward_case("blocked", a, t, false));
      cases.push_back(backward_data_case(a, t));
      cases.push_back(backward_filter_case(a, t));
    }
    cases.push_back(forward_case("7x7_stem", conv(2, 3, 33, 31, 16, 7, 7, 2, 3), t, false));
    cases.push_back(forward_case("groups2", conv(2, 32, 9, 9, 32, 3, 3, 1, 1, 1, 2), t, false));
  }
  return cases;
}

}  // namespace dtrain::test
