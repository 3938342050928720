// CPU elementwise arithmetic and bias-add: every operand shares one float dtype
// (f32, f16, bf16), maths in f32, results rounded to nearest even on store.
// Work is split in fixed chunks; bias_add_backward gives each channel to one
// thread and sums in a fixed order, so no result depends on the thread count.
// Casts live in cast.cpp.
#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/elementwise.h"

namespace dtrain::kernels {

namespace {

using cpu_io::as_f32;
using cpu_io::kBlock;
using cpu_io::store_n;

constexpr int64_t kGrain = int64_t{1} << 15;  // elements per parallel chunk

// out[i] = op(a[i], b[i]) (b may be null for unary ops); out may alias a or b.
template <typename T, typename Op>
void map(const T* a, const T* b, T* out, int64_t n, Op op) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    float ba[kBlock], bb[kBlock], bo[kBlock];
    for (int64_t i = lo; i < hi; i += kBlock) {
      const int64_t m = std::min(kBlock, hi - i);
      const float* x = as_f32(a + i, ba, m);
      const float* y = b ? as_f32(b + i, bb, m) : x;
      for (int64_t k = 0; k < m; ++k) bo[k] = op(x[k], y[k]);
      store_n(bo, out + i, m);
    }
  });
}

// Returns the operands' device.
Device check_same(std::string_view op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Device device = same_device(op, {&a, &b, &out});
  require_dtype(op, "a", a, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(b.dtype() == a.dtype() && out.dtype() == a.dtype(), "{}: dtypes {}, {}, {} differ",
               op, dtype_name(a.dtype()), dtype_name(b.dtype()), dtype_name(out.dtype()));
  require_numel(op, "b", b, a.numel());
  require_numel(op, "out", out, a.numel());
  return device;
}

template <typename Op>
void binary(DType dt, const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  cpu_io::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    map(static_cast<const T*>(a.raw()), static_cast<const T*>(b.raw()), static_cast<T*>(out.raw()),
        a.numel(), op);
  });
}

// Linear layout (inner == 1): y[o, :] = x[o, :] + bias[:], rows in parallel.
template <typename T>
void bias_rows(const BiasArgs& g, const T* x, const T* bias, T* y) {
  const int64_t rows_per_chunk = std::max<int64_t>(1, kGrain / g.channels);
  parallel_for(0, g.outer, rows_per_chunk, [&](int64_t lo, int64_t hi) {
    float bx[kBlock], bbias[kBlock], by[kBlock];
    for (int64_t c0 = 0; c0 < g.channels; c0 += kBlock) {
      const int64_t m = std::min(kBlock, g.channels - c0);
      const float* b = as_f32(bias + c0, bbias, m);
      for (int64_t o = lo; o < hi; ++o) {
        const float* xr = as_f32(x + o * g.channels + c0, bx, m);
        for (int64_t k = 0; k < m; ++k) by[k] = xr[k] + b[k];
        store_n(by, y + o * g.channels + c0, m);
      }
    }
  });
}

// Channel-planar layout (inner > 1): y[o, c, :] = x[o, c, :] + bias[c].
template <typename T>
void bias_planes(const BiasArgs& g, const T* x, const T* bias, T* y) {
  const int64_t planes = g.outer * g.channels;
  const int64_t planes_per_chunk = std::max<int64_t>(1, kGrain / g.inner);
  parallel_for(0, planes, planes_per_chunk, [&](int64_t lo, int64_t hi) {
    float bx[kBlock], by[kBlock];
    for (int64_t p = lo; p < hi; ++p) {
      const float b = cpu_io::load(bias, p % g.channels);
      for (int64_t i = 0; i < g.inner; i += kBlock) {
        const int64_t m = std::min(kBlock, g.inner - i);
        const float* xr = as_f32(x + p * g.inner + i, bx, m);
        for (int64_t k = 0; k < m; ++k) by[k] = xr[k] + b;
        store_n(by, y + p * g.inner + i, m);
      }
    }
  });
}

// dbias[c] for c in [c0, c0 + m): sums over outer (in order), then inner, in f32.
template <typename T>
void bias_grad_chunk(const BiasArgs& g, const T* dy, int64_t c0, int64_t m, float* acc) {
  float buf[kBlock];
  std::fill_n(acc, m, 0.0f);
  for (int64_t o = 0; o < g.outer; ++o) {
    if (g.inner == 1) {
      const float* d = as_f32(dy + o * g.channels + c0, buf, m);
      for (int64_t k = 0; k < m; ++k) acc[k] += d[k];
      continue;
    }
    for (int64_t k = 0; k < m; ++k) {
      const T* plane = dy + (o * g.channels + c0 + k) * g.inner;
      float s = 0.0f;
      for (int64_t i = 0; i < g.inner; i += kBlock) {
        const int64_t len = std::min(kBlock, g.inner - i);
        const float* d = as_f32(plane + i, buf, len);
        for (int64_t j = 0; j < len; ++j) s += d[j];
      }
      acc[k] += s;
    }
  }
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (check_same("add", a, b, out).is_cuda()) return cuda_ops::add(a, b, out);
  binary(a.dtype(), a, b, out, [](float x, float y) { return x + y; });
}

void add_relu(const Tensor& a, const Tensor& b, Tensor& out) {
  const Device device = check_same("add_relu", a, b, out);
  DTRAIN_CHECK(device.is_cpu() && (a.dtype() == DType::f32 || a.dtype() == DType::bf16),
               "add_relu: f32 or bf16 on the CPU only, not {}", a.str());
  // (s < 0 ? 0 : s), as the ReLU: -0 and NaN pass through. In bf16 the same as the ReLU
  // of the rounded sum: a sum of two bf16 values is 0 or at least bf16's least denormal in
  // magnitude, so no negative sum rounds to -0.
  binary(a.dtype(), a, b, out, [](float x, float y) {
    const float s = x + y;
    return s < 0.0f ? 0.0f : s;
  });
}

void mul(const Tensor& a, const Tensor& b, Tensor& out) {
  if (check_same("mul", a, b, out).is_cuda()) return cuda_ops::mul(a, b, out);
  binary(a.dtype(), a, b, out, [](float x, float y) { return x * y; });
}

void scale(float alpha, const Tensor& x, Tensor& out) {
  if (check_same("scale", x, x, out).is_cuda()) return cuda_ops::scale(alpha, x, out);
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    map(static_cast<const T*>(x.raw()), static_cast<const T*>(nullptr), static_cast<T*>(out.raw()),
        x.numel(), [alpha](float v, float) { return alpha * v; });
  });
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  if (check_same("axpy", x, y, y).is_cuda()) return cuda_ops::axpy(alpha, x, y);
  binary(x.dtype(), x, y, y, [alpha](float xv, float yv) { return yv + alpha * xv; });
}

void fill(Tensor& x, float value) {
  const Device device = same_device("fill", {&x});
  require_dtype("fill", "x", x, {DType::f32, DType::f16, DType::bf16});
  if (device.is_cuda()) return cuda_ops::fill(x, value);
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v;
    cpu_io::store(&v, 0, value);
    T* p = static_cast<T*>(x.raw());
    parallel_for(0, x.numel(), kGrain,
                 [&](int64_t lo, int64_t hi) { std::fill(p + lo, p + hi, v); });
  });
}

void bias_add(const BiasArgs& args, const Tensor& x, const Tensor& bias, Tensor& y) {
  const Device device = check_same("bias_add", x, x, y);
  same_device("bias_add", {&x, &bias});
  DTRAIN_CHECK(bias.dtype() == x.dtype(), "bias_add: bias is {}, x is {}", dtype_name(bias.dtype()),
               dtype_name(x.dtype()));
  DTRAIN_CHECK(args.outer >= 0 && args.channels >= 1 && args.inner >= 1, "bias_add: bad shape");
  require_numel("bias_add", "x", x, args.outer * args.channels * args.inner);
  require_numel("bias_add", "bias", bias, args.channels);
  if (device.is_cuda()) return cuda_ops::bias_add(args, x, bias, y);
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
    const T* bp = static_cast<const T*>(bias.raw());
    T* yp = static_cast<T*>(y.raw());
    args.inner == 1 ? bias_rows(args, xp, bp, yp) : bias_planes(args, xp, bp, yp);
  });
}

void bias_add_backward(const BiasArgs& args, const Tensor& dy, Tensor& dbias) {
  const Device device = same_device("bias_add_backward", {&dy, &dbias});
  require_dtype("bias_add_backward", "dy", dy, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(dbias.dtype() == dy.dtype(), "bias_add_backward: dbias is {}, dy is {}",
               dtype_name(dbias.dtype()), dtype_name(dy.dtype()));
  DTRAIN_CHECK(args.outer >= 0 && args.channels >= 1 && args.inner >= 1, "bias_add: bad shape");
  require_numel("bias_add_backward", "dy", dy, args.outer * args.channels * args.inner);
  require_numel("bias_add_backward", "dbias", dbias, args.channels);
  if (device.is_cuda()) return cuda_ops::bias_add_backward(args, dy, dbias);
  cpu_io::dispatch_float(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* d = static_cast<const T*>(dy.raw());
    T* db = static_cast<T*>(dbias.raw());
    // Linear: kBlock channels per task, summed down the rows. Planar: one channel per task.
    const int64_t width = args.inner == 1 ? kBlock : 1;
    const int64_t tasks = (args.channels + width - 1) / width;
    parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
      float acc[kBlock];
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t m = std::min(width, args.channels - t * width);
        bias_grad_chunk(args, d, t * width, m, acc);
        store_n(acc, db + t * width, m);
      }
    });
  });
}

}  // namespace dtrain::kernels
