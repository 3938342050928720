// Kernel-table cases for kernels/dropout.h: the mask and output against the
// reference, which draws the same Philox stream (p = 0 identity, p = 0.5, an
// offset that is not a multiple of 4, odd sizes, f32/f16/bf16), a 100k-element
// statistical case (kept fraction within 4 sigma of 1-p), the backward kernel on
// a given mask, grad mode (f32), and the mask against the CPU kernel's (on CUDA:
// both backends draw the same Philox words).
#include "kernels/dropout.h"

#include <cmath>

#include "kernels/elementwise.h"

#include "pointwise_case_util.h"
#include "ref/dropout.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;

ref::Dropout ref_args(const kernels::DropoutArgs& a) {
  return {static_cast<double>(a.p), a.seed, a.stream, a.offset};  // the kernel's float p, exactly
}

KernelCase forward_case(const char* variant, DType dt, int64_t n, kernels::DropoutArgs args) {
  KernelCase c;
  c.name = "dropout/" + std::string(variant) + "/" + dname(dt) + "/" + std::to_string(n);
  c.inputs = {{"x", Shape{n}, dt}};
  c.outputs = {{"y", Shape{n}, dt}, {"mask", Shape{n}, DType::u8}};
  c.outputs[1].differentiable = false;
  const ref::Dropout ra = ref_args(args);
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::dropout_forward(args, in[0], out[0], out[1]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::dropout(ra, n, in[0].data(), out[0].data(), out[1].data());
  };
  if (dt == DType::f32) {
    c.backward = [=](const std::vector<Tensor>&, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     Workspace) { kernels::dropout_backward(args, dout[0], out[1], din[0]); };
  }
  c.check_tol = tol_for(dt, {0.0, 4e-7});
  return c;
}

// dx = dy * mask / (1 - p) on a given mask.
KernelCase backward_case(DType dt, int64_t n, float p) {
  KernelCase c;
  c.name = "dropout/backward/" + dname(dt) + "/" + std::to_string(n);
  ArgSpec mask{"mask", Shape{n}, DType::u8, Init::integers, 0.0, 2.0};
  mask.differentiable = false;
  c.inputs = {{"dy", Shape{n}, dt}, mask};
  c.outputs = {{"dx", Shape{n}, dt}};
  const kernels::DropoutArgs args{p, 1, 2, 0};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::dropout_backward(args, in[0], in[1], out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    for (int64_t i = 0; i < n; ++i)
      out[0][i] = in[0][i] * in[1][i] / (1.0 - static_cast<double>(p));
  };
  c.check_tol = tol_for(dt, {0.0, 4e-7});
  return c;
}

// Outputs: [within 4 sigma of 1 - p (1/0), kept fraction]. The fraction is
// also compared with the reference's count over the same stream.
KernelCase statistics_case(float p) {
  constexpr int64_t n = 100000;
  KernelCase c;
  c.name = "dropout/statistics/f32/" + std::to_string(n);
  c.inputs = {{"x", Shape{n}}};
  c.outputs = {{"within_4_sigma", Shape{1}}, {"kept_fraction", Shape{1}}};
  const kernels::DropoutArgs args{p, 12345, 77, 1000};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    Tensor y = empty_on(in[0], Shape{n}, DType::f32), mask = empty_on(in[0], Shape{n}, DType::u8);
    kernels::dropout_forward(args, in[0], y, mask);
    const Tensor host_mask = to_host(mask);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) kept += host_mask.data<uint8_t>()[i];
    const double frac = static_cast<double>(kept) / n;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    kernels::fill(out[0], std::abs(frac - (1.0 - p)) <= 4 * sigma ? 1.0f : 0.0f);
    kernels::fill(out[1], static_cast<float>(frac));
  };
  const ref::Dropout ra = ref_args(args);
  c.reference = [=](const std::vector<Values>&, std::vector<Values>& out) {
    out[0][0] = 1.0;
    out[1][0] = ref::kept_fraction(ra, n);
  };
  c.check_tol = {0.0, 1e-7};
  return c;
}

// The kernel's mask (on the case's device) against the CPU kernel's mask for
// the same arguments, element for element. Output 1 = identical. On CUDA this
// is the backends-agree check of the shared Philox stream.
KernelCase cpu_mask_case(int64_t n, kernels::DropoutArgs args) {
  KernelCase c;
  c.name = "dropout/same_mask_as_cpu/f32/" + std::to_string(n);
  c.inputs = {{"x", Shape{n}}};
  c.outputs = {{"identical", Shape{1}}};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    Tensor y = empty_on(in[0], Shape{n}, DType::f32), mask = empty_on(in[0], Shape{n}, DType::u8);
    kernels::dropout_forward(args, in[0], y, mask);
    const Tensor x_host = to_host(in[0]);
    Tensor y_cpu = Tensor::empty(Shape{n}, DType::f32),
           mask_cpu = Tensor::empty(Shape{n}, DType::u8);
    kernels::dropout_forward(args, x_host, y_cpu, mask_cpu);
    const Tensor got = to_host(mask);
    bool same = true;
    for (int64_t i = 0; i < n; ++i)
      same = same && got.data<uint8_t>()[i] == mask_cpu.data<uint8_t>()[i];
    kernels::fill(out[0], same ? 1.0f : 0.0f);
  };
  c.reference = [](const std::vector<Values>&, std::vector<Values>& out) { out[0][0] = 1.0; };
  c.check_tol = {0.0, 0.0};
  return c;
}

}  // namespace

std::vector<KernelCase> cases_dropout() {
  std::vector<KernelCase> cases;
  for (DType dt : kFloatTypes) {
    cases.push_back(forward_case("p0", dt, 33, {0.0f, 7, 1, 0}));
    cases.push_back(forward_case("p0.5", dt, 1, {0.5f, 7, 1, 0}));
    cases.push_back(forward_case("p0.5", dt, 130, {0.5f, 7, 1, 0}));
    cases.push_back(forward_case("p0.1_offset3", dt, 65, {0.1f, 99, 5, 3}));
    cases.push_back(forward_case("p0.5_big", dt, 40000, {0.5f, 3, 8, 17}));
    cases.push_back(backward_case(dt, 130, 0.25f));
  }
  cases.push_back(forward_case("p0.9", DType::f32, 17, {0.9f, 1, 1, 1}));
  cases.push_back(statistics_case(0.3f));
  cases.push_back(cpu_mask_case(100003, {0.37f, 0x123456789abcdefull, 0xfedcba9876543210ull, 5}));
  return cases;
}

}  // namespace dtrain::test
