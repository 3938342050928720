// Kernel-table cases for kernels/activation.h: relu, gelu_tanh, gelu_erf, tanh on
// f32/f16/bf16, odd sizes; grad mode (f32) for the backward, and check-mode
// cases of the backward kernel itself on half types against ref derivatives.
#include "kernels/activation.h"

#include "pointwise_case_util.h"
#include "ref/activation.h"

namespace dtrain::test {

namespace {

struct Act {
  kernels::Activation kernel;
  ref::Activation ref;
  const char* name;
};

constexpr Act kActs[] = {{kernels::Activation::relu, ref::Activation::relu, "relu"},
                         {kernels::Activation::gelu_tanh, ref::Activation::gelu_tanh, "gelu_tanh"},
                         {kernels::Activation::gelu_erf, ref::Activation::gelu_erf, "gelu_erf"},
                         {kernels::Activation::tanh, ref::Activation::tanh, "tanh"}};

// range: inputs uniform in [-range, range]; the wide rows reach the saturated
// tails (and the clamps of the vectorised exp the GELUs use).
KernelCase forward_case(const Act& a, DType dt, const Shape& shape, double range = 4.0) {
  KernelCase c;
  c.name = "activation/" + std::string(a.name) + "/" + dname(dt) + "/" + shape_tag(shape) +
           (range == 4.0 ? "" : fmt::format("/x{:g}", range));
  c.inputs = {{"x", shape, dt, Init::uniform, -range, range}};
  c.outputs = {{"y", shape, dt}};
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::activation_forward(a.kernel, in[0], out[0]);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    for (size_t i = 0; i < in[0].size(); ++i) out[0][i] = ref::activation(a.ref, in[0][i]);
  };
  if (dt == DType::f32) {
    c.backward = [a](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace) {
      kernels::activation_backward(a.kernel, in[0], dout[0], din[0]);
    };
  }
  c.check_tol = tol_for(dt, {2e-6, 2e-6});
  return c;
}

// dx = dy * act'(x), checked directly (covers half storage of the backward).
KernelCase backward_case(const Act& a, DType dt, const Shape& shape, double range = 4.0) {
  KernelCase c;
  c.name = "activation/" + std::string(a.name) + "_backward/" + dname(dt) + "/" + shape_tag(shape) +
           (range == 4.0 ? "" : fmt::format("/x{:g}", range));
  c.inputs = {{"x", shape, dt, Init::uniform, -range, range}, {"dy", shape, dt}};
  c.outputs = {{"dx", shape, dt}};
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::activation_backward(a.kernel, in[0], in[1], out[0]);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    for (size_t i = 0; i < in[0].size(); ++i) {
      out[0][i] = in[1][i] * ref::activation_derivative(a.ref, in[0][i]);
    }
  };
  c.check_tol = tol_for(dt, {2e-6, 2e-6});
  return c;
}

}  // namespace

std::vector<KernelCase> cases_activation() {
  std::vector<KernelCase> cases;
  for (const Act& a : kActs) {
    for (DType dt : kFloatTypes) {
      for (const Shape& s : {Shape{1}, Shape{7}, Shape{33, 65}, Shape{3, 1000}}) {
        cases.push_back(forward_case(a, dt, s));
      }
      cases.push_back(backward_case(a, dt, Shape{17, 33}));
    }
    cases.push_back(forward_case(a, DType::f32, Shape{4096}, 120.0));
    cases.push_back(backward_case(a, DType::f32, Shape{4096}, 120.0));
  }
  return cases;
}

}  // namespace dtrain::test
