// Kernel-table cases for kernels/elementwise.h arithmetic: add, mul, scale,
// axpy, fill, bias_add (linear: inner = 1; NCHW: inner = H*W) and
// bias_add_backward on f32/f16/bf16; grad mode (f32) for add, mul, scale and
// bias_add. Casts are in cases_cast.cpp.
#include "kernels/elementwise.h"

#include "kernels/memory.h"
#include "pointwise_case_util.h"
#include "ref/elementwise.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;
using Fwd = std::function<void(const std::vector<Tensor>&, std::vector<Tensor>&, Workspace)>;
using Ref = std::function<void(const std::vector<Values>&, std::vector<Values>&)>;
using Bwd = decltype(KernelCase::backward);

void copy(const Tensor& from, Tensor& to) { kernels::copy(from, to); }

KernelCase make(const std::string& variant, DType dt, const Shape& s, int inputs, Fwd fwd, Ref ref,
                Bwd bwd) {
  KernelCase c;
  c.name = "elementwise/" + variant + "/" + dname(dt) + "/" + shape_tag(s);
  const char* names[] = {"a", "b"};
  for (int i = 0; i < inputs; ++i) c.inputs.push_back({names[i], s, dt, Init::uniform, -2.0, 2.0});
  c.outputs = {{"out", s, dt}};
  c.forward = std::move(fwd);
  c.reference = std::move(ref);
  if (dt == DType::f32) c.backward = std::move(bwd);
  c.check_tol = tol_for(dt, {1e-7, 1e-6});
  return c;
}

// out[i] = f(a[i], b[i]) for the reference lambdas.
template <typename F>
Ref pointwise(F f) {
  return [f](const std::vector<Values>& in, std::vector<Values>& out) {
    for (size_t i = 0; i < out[0].size(); ++i) out[0][i] = f(in, i);
  };
}

void add_arith(std::vector<KernelCase>& cases, DType dt, const Shape& s) {
  cases.push_back(make(
      "add", dt, s, 2, [](auto& in, auto& out, Workspace) { kernels::add(in[0], in[1], out[0]); },
      pointwise([](auto& in, size_t i) { return in[0][i] + in[1][i]; }),
      [](auto&, auto&, auto& dout, auto& din, Workspace) {
        copy(dout[0], din[0]);
        copy(dout[0], din[1]);
      }));
  cases.push_back(make(
      "mul", dt, s, 2, [](auto& in, auto& out, Workspace) { kernels::mul(in[0], in[1], out[0]); },
      pointwise([](auto& in, size_t i) { return in[0][i] * in[1][i]; }),
      [](auto& in, auto&, auto& dout, auto& din, Workspace) {
        kernels::mul(dout[0], in[1], din[0]);
        kernels::mul(dout[0], in[0], din[1]);
      }));
  cases.push_back(make(
      "scale", dt, s, 1,
      [](auto& in, auto& out, Workspace) { kernels::scale(-1.5f, in[0], out[0]); },
      pointwise([](auto& in, size_t i) { return -1.5 * in[0][i]; }),
      [](auto&, auto&, auto& dout, auto& din, Workspace) {
        kernels::scale(-1.5f, dout[0], din[0]);
      }));
  cases.push_back(make(
      "axpy", dt, s, 2,
      [](auto& in, auto& out, Workspace) {
        copy(in[1], out[0]);  // y starts as input b
        kernels::axpy(0.75f, in[0], out[0]);
      },
      pointwise([](auto& in, size_t i) { return in[1][i] + 0.75 * in[0][i]; }), nullptr));
  cases.push_back(make(
      "fill", dt, s, 0, [](auto&, auto& out, Workspace) { kernels::fill(out[0], 0.3f); },
      pointwise([dt](auto&, size_t) { return ref::round_to_dtype(0.3, dt); }), nullptr));
  cases.back().check_tol = {0.0, 0.0};
}

// x [outer, channels, inner] + bias [channels]; grad: dx = dy, dbias = sum dy.
KernelCase bias_case(DType dt, kernels::BiasArgs g, const char* layout) {
  KernelCase c;
  const Shape s{g.outer, g.channels, g.inner};
  c.name = "elementwise/bias_add_" + std::string(layout) + "/" + dname(dt) + "/" + shape_tag(s);
  c.inputs = {{"x", s, dt, Init::uniform, -2.0, 2.0}, {"bias", Shape{g.channels}, dt}};
  c.outputs = {{"y", s, dt}};
  c.forward = [=](auto& in, auto& out, Workspace) { kernels::bias_add(g, in[0], in[1], out[0]); };
  c.reference = [=](auto& in, auto& out) {
    ref::bias_add(g.outer, g.channels, g.inner, in[0].data(), in[1].data(), out[0].data());
  };
  if (dt == DType::f32) {
    c.backward = [=](auto&, auto&, auto& dout, auto& din, Workspace) {
      copy(dout[0], din[0]);
      kernels::bias_add_backward(g, dout[0], din[1]);
    };
  }
  c.check_tol = tol_for(dt, {1e-7, 1e-6});
  return c;
}

KernelCase bias_backward_case(DType dt, kernels::BiasArgs g, const char* layout) {
  KernelCase c;
  const Shape s{g.outer, g.channels, g.inner};
  c.name =
      "elementwise/bias_add_backward_" + std::string(layout) + "/" + dname(dt) + "/" + shape_tag(s);
  c.inputs = {{"dy", s, dt}};
  c.outputs = {{"dbias", Shape{g.channels}, dt}};
  c.forward = [=](auto& in, auto& out, Workspace) { kernels::bias_add_backward(g, in[0], out[0]); };
  c.reference = [=](auto& in, auto& out) {
    ref::bias_add_backward(g.outer, g.channels, g.inner, in[0].data(), out[0].data());
  };
  c.check_tol = tol_for(dt, {1e-5, 1e-5});
  return c;
}

}  // namespace

std::vector<KernelCase> cases_elementwise() {
  std::vector<KernelCase> cases;
  for (DType dt : kFloatTypes) {
    for (const Shape& s : {Shape{1}, Shape{7}, Shape{33, 65}}) add_arith(cases, dt, s);
    for (auto [g, layout] : {std::pair{kernels::BiasArgs{17, 33, 1}, "linear"},
                             std::pair{kernels::BiasArgs{1, 1, 1}, "linear"},
                             std::pair{kernels::BiasArgs{3, 5, 49}, "nchw"},
                             std::pair{kernels::BiasArgs{2, 300, 3}, "nchw"}}) {
      cases.push_back(bias_case(dt, g, layout));
      cases.push_back(bias_backward_case(dt, g, layout));
    }
    cases.push_back(bias_backward_case(dt, {130, 260, 1}, "linear"));
  }
  add_arith(cases, DType::f32, Shape{100003});  // several parallel chunks
  return cases;
}

}  // namespace dtrain::test
