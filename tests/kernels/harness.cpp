// Runs kernel-table cases: input generation, output poisoning, comparison
// against the fp64 reference, and finite-difference gradient checks.
#include "harness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "core/rng.h"
#include "kernels/memory.h"

namespace dtrain::test {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Aligned scratch that lives for one run, filled with a poison pattern.
struct Buffer {
  std::unique_ptr<std::byte[]> mem;
  size_t bytes = 0;
  explicit Buffer(size_t n) : mem(new std::byte[n + 64]), bytes(n) {
    std::memset(mem.get(), 0xA5, n + 64);
  }
  kernels::Workspace workspace() {
    auto* p = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(mem.get()) + 63) / 64 * 64);
    return {p, bytes};
  }
};

Values generate(const ArgSpec& a, uint64_t seed, uint64_t stream) {
  const int64_t n = a.shape.numel();
  Values v(static_cast<size_t>(n), 0.0);
  const Philox rng(seed, stream);
  for (int64_t i = 0; i < n; ++i) {
    const double u = rng.uniform(static_cast<uint64_t>(i));
    switch (a.init) {
      case Init::uniform:
        v[i] = a.lo + u * (a.hi - a.lo);
        break;
      case Init::integers:
        v[i] = std::floor(a.lo + u * (a.hi - a.lo));
        break;
      case Init::explicit_values:
        DTRAIN_CHECK(a.values.size() == static_cast<size_t>(n), "{}: {} values for {} elements",
                     a.name, a.values.size(), n);
        v[i] = a.values[static_cast<size_t>(i)];
        break;
      case Init::zeros:
        v[i] = 0.0;
        break;
    }
  }
  return v;
}

// Fills a tensor with a pattern no kernel produces on purpose: NaN for floats,
// 0xA5 bytes for integers.
void poison(Tensor& t) {
  if (t.dtype() == DType::f32) {
    std::fill_n(t.data<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
  } else if (t.dtype() == DType::f64) {
    std::fill_n(t.data<double>(), t.numel(), kNaN);
  } else if (t.dtype() == DType::f16 || t.dtype() == DType::bf16) {
    auto* p = static_cast<uint16_t*>(t.raw());
    std::fill_n(p, t.numel(), t.dtype() == DType::f16 ? uint16_t{0x7e00} : uint16_t{0x7fc0});
  } else {
    std::memset(t.raw(), 0xA5, t.nbytes());
  }
}

Tensor make_output(const ArgSpec& a, Device device) {
  Tensor t = Tensor::empty(a.shape, a.dtype);
  poison(t);
  return on_device(t, device);
}

// The case's workspace: poisoned host memory on the CPU, device memory on CUDA.
struct DeviceWorkspace {
  Buffer host;
  Tensor device_mem;
  DeviceWorkspace(size_t bytes, Device device) : host(device.is_cpu() ? bytes : 0) {
    if (!device.is_cpu() && bytes > 0) {
      device_mem = Tensor::empty(Shape{static_cast<int64_t>(bytes)}, DType::u8,
                                 &kernels::device_allocator(device));
    }
  }
  kernels::Workspace workspace() {
    if (!device_mem.defined()) return host.workspace();
    return {device_mem.raw(), device_mem.nbytes()};
  }
};

size_t workspace_bytes(const KernelCase& c, Device device) {
  return c.workspace_on ? c.workspace_on(device) : c.workspace_bytes;
}

bool close(double got, double want, const Tolerance& tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  if (!std::isfinite(got)) return false;
  return std::abs(got - want) <= tol.atol + tol.rtol * std::abs(want);
}

std::string compare(const std::string& what, const Values& got, const Values& want,
                    const Tolerance& tol) {
  if (got.size() != want.size()) {
    return fmt::format("{}: {} elements, reference has {}", what, got.size(), want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!close(got[i], want[i], tol)) {
      return fmt::format("{}[{}]: got {:.9g}, want {:.9g} (atol {:g}, rtol {:g})", what, i, got[i],
                         want[i], tol.atol, tol.rtol);
    }
  }
  return {};
}

struct Inputs {
  std::vector<Tensor> tensors;
  std::vector<Values> values;  // the dtype-rounded values the kernel sees
};

Inputs make_inputs(const KernelCase& c, Device device) {
  Inputs in;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const ArgSpec& a = c.inputs[i];
    Tensor t = from_values(generate(a, c.seed, i), a.shape, a.dtype);
    in.values.push_back(to_values(t));
    in.tensors.push_back(on_device(t, device));
  }
  return in;
}

std::vector<Values> run_reference(const KernelCase& c, const std::vector<Values>& in) {
  std::vector<Values> out;
  for (const ArgSpec& a : c.outputs) out.emplace_back(static_cast<size_t>(a.shape.numel()), kNaN);
  c.reference(in, out);
  return out;
}

// The outputs, copied back to the host.
std::vector<Tensor> run_forward(const KernelCase& c, const std::vector<Tensor>& in, Device device) {
  std::vector<Tensor> out;
  for (const ArgSpec& a : c.outputs) out.push_back(make_output(a, device));
  DeviceWorkspace ws(workspace_bytes(c, device), device);
  c.forward(in, out, ws.workspace());
  for (Tensor& t : out) t = to_host(t);
  return out;
}

// loss = sum over differentiable outputs of weight . output
double weighted_loss(const KernelCase& c, const std::vector<Values>& out,
                     const std::vector<Values>& weights) {
  double loss = 0.0;
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    if (!c.outputs[o].differentiable) continue;
    for (size_t i = 0; i < out[o].size(); ++i) loss += weights[o][i] * out[o][i];
  }
  return loss;
}

std::vector<int64_t> sample_indices(int64_t n, int samples, uint64_t seed) {
  std::vector<int64_t> idx;
  if (n <= samples) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  const Philox rng(seed, 0x5A5A);
  idx.push_back(0);
  idx.push_back(n - 1);
  for (int s = 2; s < samples; ++s) idx.push_back(static_cast<int64_t>(rng.u32(s) % n));
  return idx;
}

}  // namespace

std::string shape_tag(const Shape& s) {
  std::string tag;
  for (int i = 0; i < s.rank(); ++i) tag += (i ? "x" : "") + std::to_string(s[i]);
  return tag;
}

Tensor on_device(const Tensor& host, Device device) {
  if (device.is_cpu() || !host.defined()) return host;
  Tensor t = Tensor::empty(host.shape(), host.dtype(), &kernels::device_allocator(device));
  kernels::copy(host, t);
  return t;
}

Tensor empty_on(const Tensor& like, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, &kernels::device_allocator(like.device()));
}

Tensor to_host(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  kernels::copy(t, h);
  return h;
}

float scalar(const Tensor& t) {
  DTRAIN_CHECK(t.numel() >= 1, "scalar of an empty tensor {}", t.str());
  return to_host(t.view(0, Shape{1})).data<float>()[0];
}

Values to_values(const Tensor& device_tensor) {
  const Tensor t = to_host(device_tensor);
  Values v(static_cast<size_t>(t.numel()));
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) v[i] = t.data<float>()[i];
      break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) v[i] = t.data<double>()[i];
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) v[i] = to_f32(t.data<f16>()[i]);
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) v[i] = to_f32(t.data<bf16>()[i]);
      break;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) v[i] = t.data<int32_t>()[i];
      break;
    case DType::i64:
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(t.data<int64_t>()[i]);
      break;
    case DType::u8:
      for (int64_t i = 0; i < n; ++i) v[i] = t.data<uint8_t>()[i];
      break;
  }
  return v;
}

Tensor from_values(const Values& v, const Shape& shape, DType dtype) {
  DTRAIN_CHECK(static_cast<int64_t>(v.size()) == shape.numel(), "{} values for shape {}", v.size(),
               shape.str());
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = shape.numel();
  switch (dtype) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(v[i]);
      break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = v[i];
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) t.data<f16>()[i] = to_f16(static_cast<float>(v[i]));
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) t.data<bf16>()[i] = to_bf16(static_cast<float>(v[i]));
      break;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(v[i]);
      break;
    case DType::i64:
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(v[i]);
      break;
    case DType::u8:
      for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(v[i]);
      break;
  }
  return t;
}

CaseResult run_check(const KernelCase& c, Device device) {
  const Inputs in = make_inputs(c, device);
  const std::vector<Tensor> out = run_forward(c, in.tensors, device);
  const std::vector<Values> want = run_reference(c, in.values);
  for (size_t o = 0; o < out.size(); ++o) {
    std::string err = compare(c.outputs[o].name, to_values(out[o]), want[o], c.check_tol);
    if (!err.empty()) return {false, err};
  }
  // Same inputs, same thread count: the same bits.
  const std::vector<Tensor> again = run_forward(c, in.tensors, device);
  for (size_t o = 0; o < out.size(); ++o) {
    if (std::memcmp(out[o].raw(), again[o].raw(), out[o].nbytes()) != 0) {
      return {false, fmt::format("{}: a second run gave different bits", c.outputs[o].name)};
    }
  }
  return {};
}

CaseResult run_grad(const KernelCase& c, Device device) {
  DTRAIN_CHECK(static_cast<bool>(c.backward), "{} has no backward", c.name);
  const Inputs in = make_inputs(c, device);
  std::vector<Tensor> out = run_forward(c, in.tensors, device);
  for (Tensor& t : out) t = on_device(t, device);

  std::vector<Values> weights;
  std::vector<Tensor> dout;
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    const ArgSpec& a = c.outputs[o];
    if (!a.differentiable) {
      weights.emplace_back(static_cast<size_t>(a.shape.numel()), 0.0);
      dout.emplace_back();
      continue;
    }
    ArgSpec w{a.name, a.shape, a.dtype, Init::uniform, -1.0, 1.0};
    Tensor t = from_values(generate(w, c.seed + 7919, 1000 + o), a.shape, a.dtype);
    weights.push_back(to_values(t));
    dout.push_back(on_device(t, device));
  }

  std::vector<Tensor> din;
  for (const ArgSpec& a : c.inputs) {
    din.push_back(a.differentiable ? make_output(a, device) : Tensor());
  }
  DeviceWorkspace ws(workspace_bytes(c, device), device);
  c.backward(in.tensors, out, dout, din, ws.workspace());

  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].differentiable) continue;
    const Values analytic = to_values(din[i]);
    for (int64_t e : sample_indices(c.inputs[i].shape.numel(), c.grad_samples, c.seed + i)) {
      std::vector<Values> x = in.values;
      const double x0 = x[i][e];
      const double h = c.fd_step * std::max(1.0, std::abs(x0));
      x[i][e] = x0 + h;
      const double plus = weighted_loss(c, run_reference(c, x), weights);
      x[i][e] = x0 - h;
      const double minus = weighted_loss(c, run_reference(c, x), weights);
      const double fd = (plus - minus) / (2 * h);
      if (!close(analytic[e], fd, c.grad_tol)) {
        return {false, fmt::format("d{}[{}]: backward {:.9g}, finite difference {:.9g}",
                                   c.inputs[i].name, e, analytic[e], fd)};
      }
    }
  }
  return {};
}

}  // namespace dtrain::test
