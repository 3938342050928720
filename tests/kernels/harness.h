// The kernel table. Each case is declared once (inputs, outputs, the kernel
// call, the fp64 reference, the analytic backward, tolerances) and runs in two
// modes: "check" (kernel vs reference on the same dtype-rounded inputs) and
// "grad" (the kernel's backward vs central finite differences of the fp64
// reference). Outputs are poisoned (NaN / 0xA5 bytes) before every run, so an
// element a kernel forgets to write fails. On a CUDA device the inputs, outputs,
// gradients and workspace live on the device (explicit copies); the reference
// and the comparison stay on the host. Case lambdas use only kernels (and
// kernels::copy), never host pointers, so they run on either device.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/common.h"

namespace dtrain::test {

using Values = std::vector<double>;  // a tensor's elements in fp64, row-major

enum class Init : uint8_t {
  uniform,          // uniform in [lo, hi)
  integers,         // integers uniform in [lo, hi) (ids, labels)
  explicit_values,  // `values`, as given (special values: inf, nan, ties, ...)
  zeros,
};

struct ArgSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Init init = Init::uniform;
  double lo = -1.0, hi = 1.0;
  Values values;               // for Init::explicit_values
  bool differentiable = true;  // inputs: checked in grad mode; outputs: part of the loss
};

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;
};

struct KernelCase {
  std::string name;  // "<family>/<variant>/<dtype>/<shape>", family = text before the first '/'
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec>
      outputs;  // forward outputs, including saved tensors (mark those non-differentiable)
  size_t workspace_bytes = 0;
  // Per-device workspace where backends differ (GEMM: cuBLASLt's); empty means
  // workspace_bytes on every device.
  std::function<size_t(Device)> workspace_on;

  // The kernel under test. Inputs are already in their dtype; outputs are
  // allocated and poisoned.
  std::function<void(const std::vector<Tensor>& in, std::vector<Tensor>& out,
                     kernels::Workspace ws)>
      forward;
  // The fp64 reference on the same (dtype-rounded) input values; fills every output.
  std::function<void(const std::vector<Values>& in, std::vector<Values>& out)> reference;
  // Analytic backward; empty means the case has no grad mode. dout[i] holds
  // d(loss)/d(out[i]) for differentiable outputs (undefined tensors otherwise);
  // din[i] is allocated and poisoned for each differentiable input (undefined
  // otherwise) and must be fully written.
  std::function<void(const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace ws)>
      backward;

  Tolerance check_tol;             // forward vs reference
  Tolerance grad_tol{1e-3, 1e-3};  // backward vs finite differences
  int grad_samples = 48;  // elements per input checked by finite differences (all if fewer)
  double fd_step = 1e-6;  // central difference step (relative to max(1, |x|))
  uint64_t seed = 1;      // input generation seed
};

// One function per family, each in tests/kernels/cases_<family>.cpp.
std::vector<KernelCase> cases_gemm();
std::vector<KernelCase> cases_conv();
std::vector<KernelCase> cases_batchnorm();
std::vector<KernelCase> cases_pooling();
std::vector<KernelCase> cases_attention();
std::vector<KernelCase> cases_layernorm();
std::vector<KernelCase> cases_activation();
std::vector<KernelCase> cases_softmax();
std::vector<KernelCase> cases_embedding();
std::vector<KernelCase> cases_dropout();
std::vector<KernelCase> cases_elementwise();
std::vector<KernelCase> cases_cast();
std::vector<KernelCase> cases_reduce();
std::vector<KernelCase> cases_layout();
std::vector<KernelCase> cases_optimizer();
std::vector<KernelCase> cases_compress();

std::vector<KernelCase> all_cases();  // the explicit registry, in the order above

struct CaseResult {
  bool passed = true;
  std::string detail;  // first mismatch: output, index, got, want
};

CaseResult run_check(const KernelCase& c, Device device = Device::cpu());
CaseResult run_grad(const KernelCase& c, Device device = Device::cpu());

// Helpers for writing cases.
std::string shape_tag(const Shape& s);  // "3x5x7"
Values to_values(const Tensor& t);      // any dtype, any device -> fp64 (host)
Tensor from_values(const Values& v, const Shape& shape, DType dtype);  // rounds to dtype
Tensor on_device(const Tensor& host, Device device);  // a copy on `device` (itself for cpu)
Tensor to_host(const Tensor& t);                      // a host copy (itself for cpu)
// Scratch for a case lambda, uninitialised, on `like`'s device (intermediate
// results such as saved statistics must live where the kernel runs).
Tensor empty_on(const Tensor& like, const Shape& shape, DType dtype);
float scalar(const Tensor& t);  // element 0 of an f32 tensor, any device

}  // namespace dtrain::test
