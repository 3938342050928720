// Kernel-table cases for pooling: max (argmax saved, ties and NaN), average
// with padding counted or not, 3x3 s2 p1, odd sizes, rectangular windows and
// global average; f32 in grad mode, half dtypes checked forward and backward.
#include <limits>

#include "harness.h"
#include "kernels/pooling.h"
#include "ref/pooling.h"

namespace dtrain::test {
namespace {

using kernels::PadCount;
using kernels::Pool2dArgs;
using kernels::PoolKind;

Pool2dArgs pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel, int64_t stride,
                int64_t pad, PadCount count = PadCount::exclude) {
  Pool2dArgs a;
  a.n = n, a.c = c, a.h = h, a.w = w;
  a.kernel_h = a.kernel_w = kernel;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = pad;
  a.pad_count = count;
  return a;
}

Tolerance tolerance(DType t) {
  if (t == DType::bf16) return {1e-2, 1e-2};
  if (t == DType::f16) return {2e-3, 2e-3};
  return {1e-6, 1e-6};
}

std::string kind_name(PoolKind k, const Pool2dArgs& a) {
  if (k == PoolKind::max) return "max";
  return a.pad_count == PadCount::include ? "avg_incl" : "avg_excl";
}

std::string tag(const Pool2dArgs& a) {
  return fmt::format("{}x{}x{}x{}_k{}x{}_s{}x{}_p{}x{}", a.n, a.c, a.h, a.w, a.kernel_h, a.kernel_w,
                     a.stride_h, a.stride_w, a.pad_h, a.pad_w);
}

Shape x_shape(const Pool2dArgs& a) { return {a.n, a.c, a.h, a.w}; }
Shape y_shape(const Pool2dArgs& a) { return {a.n, a.c, a.out_h(), a.out_w()}; }

KernelCase forward_case(PoolKind k, const Pool2dArgs& a, DType t, bool grad) {
  KernelCase c;
  c.name = fmt::format("pooling/{}/{}/{}", kind_name(k, a), dtype_name(t), tag(a));
  c.inputs = {{"x", x_shape(a), t}};
  ArgSpec argmax{"argmax", y_shape(a), DType::i32};
  argmax.differentiable = false;
  c.outputs = {{"y", y_shape(a), t}};
  if (k == PoolKind::max) c.outputs.push_back(argmax);
  c.forward = [k, a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    Tensor none;
    kernels::pool2d_forward(k, a, in[0], out[0], k == PoolKind::max ? out[1] : none);
  };
  c.reference = [k, a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::pool2d_forward(k, a, in[0].data(), out[0].data(),
                        k == PoolKind::max ? out[1].data() : nullptr);
  };
  if (grad) {
    c.backward = [k, a](const std::vector<Tensor>&, const std::vector<Tensor>& out,
                        const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                        kernels::Workspace) {
      kernels::pool2d_backward(k, a, dout[0], k == PoolKind::max ? out[1] : Tensor(), din[0]);
    };
  }
  c.check_tol = tolerance(t);
  return c;
}

// The backward kernel against the reference for any dtype: argmax comes from
// running the forward on x inside the case.
KernelCase backward_case(PoolKind k, const Pool2dArgs& a, DType t) {
  KernelCase c;
  c.name = fmt::format("pooling/{}_backward/{}/{}", kind_name(k, a), dtype_name(t), tag(a));
  c.inputs = {{"x", x_shape(a), t}, {"dy", y_shape(a), t}};
  c.outputs = {{"dx", x_shape(a), t}};
  c.forward = [k, a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    Tensor y = Tensor::empty(y_shape(a), in[0].dtype());
    Tensor argmax = Tensor::empty(y_shape(a), DType::i32);
    kernels::pool2d_forward(k, a, in[0], y, argmax);
    kernels::pool2d_backward(k, a, in[1], argmax, out[0]);
  };
  c.reference = [k, a](const std::vector<Values>& in, std::vector<Values>& out) {
    Values y(static_cast<size_t>(y_shape(a).numel())), argmax(y.size());
    ref::pool2d_forward(k, a, in[0].data(), y.data(), argmax.data());
    ref::pool2d_backward(k, a, in[1].data(), argmax.data(), out[0].data());
  };
  c.check_tol = tolerance(t);
  return c;
}

// Ties (first maximum wins) and a NaN (propagates, its index saved).
KernelCase special_values_case() {
  const Pool2dArgs a = pool(1, 1, 4, 4, 2, 2, 0);
  KernelCase c = forward_case(PoolKind::max, a, DType::f32, false);
  c.name = "pooling/max_special/f32/" + tag(a);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c.inputs[0].init = Init::explicit_values;
  c.inputs[0].values = {1, 1, 2, nan, 1, 0, 2, 5, -3, -3, 7, 7, -3, -3, 7, 7};
  return c;
}

KernelCase global_case(int64_t n, int64_t ch, int64_t hw, DType t, bool grad) {
  KernelCase c;
  c.name = fmt::format("pooling/global_avg/{}/{}x{}x{}", dtype_name(t), n, ch, hw);
  c.inputs = {{"x", Shape{n, ch, hw}, t}};
  c.outputs = {{"y", Shape{n, ch}, t}};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::global_avg_pool_forward(n, ch, hw, in[0], out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::global_avg_pool_forward(n, ch, hw, in[0].data(), out[0].data());
  };
  if (grad) {
    c.backward = [=](const std::vector<Tensor>&, const std::vector<Tensor>&,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace) {
      kernels::global_avg_pool_backward(n, ch, hw, dout[0], din[0]);
    };
  }
  c.check_tol = tolerance(t);
  if (t == DType::f32) c.check_tol = {1e-5, 1e-5};
  return c;
}

}  // namespace

std::vector<KernelCase> cases_pooling() {
  std::vector<KernelCase> cases;
  Pool2dArgs rect = pool(2, 3, 7, 10, 2, 1, 1);
  rect.kernel_w = 3, rect.stride_w = 2;
  const Pool2dArgs shapes[] = {pool(2, 3, 9, 8, 3, 2, 1), pool(1, 2, 7, 7, 2, 2, 0),
                               pool(2, 2, 6, 5, 3, 1, 1), pool(1, 3, 5, 5, 1, 1, 0),
                               pool(1, 1, 1, 1, 1, 1, 0), rect};
  for (const Pool2dArgs& base : shapes) {
    for (PadCount count : {PadCount::exclude, PadCount::include}) {
      Pool2dArgs a = base;
      a.pad_count = count;
      if (count == PadCount::exclude)
        cases.push_back(forward_case(PoolKind::max, a, DType::f32, true));
      cases.push_back(forward_case(PoolKind::avg, a, DType::f32, true));
    }
  }
  cases.push_back(special_values_case());
  const Pool2dArgs stem = pool(2, 16, 33, 31, 3, 2, 1);  // ResNet's 3x3 s2 p1 after the stem
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    Pool2dArgs incl = stem;
    incl.pad_count = PadCount::include;
    cases.push_back(forward_case(PoolKind::max, stem, t, false));
    cases.push_back(forward_case(PoolKind::avg, stem, t, false));
    cases.push_back(forward_case(PoolKind::avg, incl, t, false));
    cases.push_back(backward_case(PoolKind::max, stem, t));
    cases.push_back(backward_case(PoolKind::avg, stem, t));
    cases.push_back(backward_case(PoolKind::avg, incl, t));
    cases.push_back(global_case(2, 3, 49, t, t == DType::f32));
    cases.push_back(global_case(4, 64, 7, t, false));
  }
  cases.push_back(global_case(1, 5, 1, DType::f32, true));
  return cases;
}

}  // namespace dtrain::test
