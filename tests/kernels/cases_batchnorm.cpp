// Kernel-table cases for batch norm: training forward (grad mode through the
// backward kernel), inference forward, and the backward kernel on its own for
// half dtypes. Shapes cover HW = 1, a single sample, and rows longer than the
// kernel's 512-element chunks.

#include "harness.h"
#include "kernels/batchnorm.h"
#include "kernels/memory.h"
#include "ref/batchnorm.h"

namespace dtrain::test {
namespace {

using kernels::BatchNormArgs;

BatchNormArgs bn(int64_t n, int64_t c, int64_t hw) {
  BatchNormArgs a;
  a.n = n, a.c = c, a.hw = hw;
  return a;
}

Tolerance tolerance(DType t) {
  if (t == DType::bf16) return {2e-2, 1e-2};
  if (t == DType::f16) return {3e-3, 2e-3};
  return {2e-5, 2e-5};
}

std::string tag(const BatchNormArgs& a) { return fmt::format("{}x{}x{}", a.n, a.c, a.hw); }

// Per-channel f32 input.
ArgSpec channel(const char* name, const BatchNormArgs& a, double lo, double hi, bool diff) {
  ArgSpec s{name, Shape{a.c}, DType::f32, Init::uniform, lo, hi};
  s.differentiable = diff;
  return s;
}
ArgSpec saved(const char* name, const BatchNormArgs& a) {
  ArgSpec s{name, Shape{a.c}, DType::f32};
  s.differentiable = false;
  return s;
}

KernelCase train_case(const BatchNormArgs& a, DType t, bool grad) {
  KernelCase c;
  c.name = fmt::format("batchnorm/train/{}/{}", dtype_name(t), tag(a));
  const Shape x{a.n, a.c, a.hw};
  c.inputs = {{"x", x, t, Init::uniform, -2.0, 3.0},
              channel("gamma", a, 0.5, 1.5, true),
              channel("beta", a, -1.0, 1.0, true),
              channel("running_mean", a, -1, 1, false),
              channel("running_var", a, 0.5, 1.5, false)};
  c.outputs = {{"y", x, t},
               saved("running_mean", a),
               saved("running_var", a),
               saved("save_mean", a),
               saved("save_invstd", a)};
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::copy(in[3], out[1]);
    kernels::copy(in[4], out[2]);
    kernels::batch_norm_forward_train(a, in[0], in[1], in[2], out[0], out[1], out[2], out[3],
                                      out[4]);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    out[1] = in[3];
    out[2] = in[4];
    ref::batch_norm_forward_train(a, in[0].data(), in[1].data(), in[2].data(), out[0].data(),
                                  out[1].data(), out[2].data(), out[3].data(), out[4].data());
  };
  if (grad) {
    c.backward = [a](const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace) {
      kernels::batch_norm_backward(a, in[0], dout[0], in[1], out[3], out[4], din[0], din[1],
                                   din[2]);
    };
  }
  c.check_tol = tolerance(t);
  c.grad_tol = {2e-3, 2e-3};
  return c;
}

KernelCase infer_case(const BatchNormArgs& a, DType t) {
  KernelCase c;
  c.name = fmt::format("batchnorm/infer/{}/{}", dtype_name(t), tag(a));
  const Shape x{a.n, a.c, a.hw};
  c.inputs = {{"x", x, t, Init::uniform, -2.0, 3.0},
              channel("gamma", a, 0.5, 1.5, true),
              channel("beta", a, -1.0, 1.0, true),
              channel("running_mean", a, -1, 1, false),
              channel("running_var", a, 0.5, 1.5, false)};
  c.outputs = {{"y", x, t}};
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::batch_norm_forward_infer(a, in[0], in[1], in[2], in[3], in[4], out[0]);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::batch_norm_forward_infer(a, in[0].data(), in[1].data(), in[2].data(), in[3].data(),
                                  in[4].data(), out[0].data());
  };
  c.check_tol = tolerance(t);
  return c;
}

// The backward kernel against the reference backward, for any saved stats.
KernelCase backward_case(const BatchNormArgs& a, DType t) {
  KernelCase c;
  c.name = fmt::format("batchnorm/backward/{}/{}", dtype_name(t), tag(a));
  const Shape x{a.n, a.c, a.hw};
  c.inputs = {{"x", x, t, Init::uniform, -2.0, 3.0},
              {"dy", x, t},
              channel("gamma", a, 0.5, 1.5, true),
              channel("save_mean", a, -0.5, 0.5, true),
              channel("save_invstd", a, 0.5, 2.0, true)};
  c.outputs = {{"dx", x, t}, saved("dgamma", a), saved("dbeta", a)};
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::batch_norm_backward(a, in[0], in[1], in[2], in[3], in[4], out[0], out[1], out[2]);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::batch_norm_backward(a, in[0].data(), in[1].data(), in[2].data(), in[3].data(),
                             in[4].data(), out[0].data(), out[1].data(), out[2].data());
  };
  c.check_tol = tolerance(t);
  if (t == DType::f32) c.check_tol = {1e-4, 1e-4};  // sums over N*HW
  return c;
}

}  // namespace

std::vector<KernelCase> cases_batchnorm() {
  std::vector<KernelCase> cases;
  for (const BatchNormArgs& a : {bn(4, 3, 5), bn(2, 5, 1), bn(1, 2, 7), bn(3, 2, 17)}) {
    cases.push_back(train_case(a, DType::f32, true));
  }
  const BatchNormArgs big = bn(3, 4, 700), wide = bn(8, 16, 49);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    cases.push_back(train_case(big, t, false));
    cases.push_back(train_case(wide, t, false));
    cases.push_back(infer_case(bn(2, 3, 33), t));
    cases.push_back(infer_case(big, t));
    cases.push_back(backward_case(bn(4, 3, 5), t));
    cases.push_back(backward_case(big, t));
  }
  return cases;
}

}  // namespace dtrain::test
