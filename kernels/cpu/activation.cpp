// CPU activations, forward and backward, in f32 on f32/f16/bf16 storage:
//   relu(x)      = max(x, 0)                       d/dx = [x > 0]
//   gelu_tanh(x) = x/2 (1 + tanh(u)), u = k (x + c x^3), k = sqrt(2/pi), c = 0.044715
//                  d/dx = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2), t = tanh(u)
//   gelu_erf(x)  = x/2 (1 + erf(x / sqrt 2))       d/dx = Phi(x) + x phi(x)
//   tanh(x)                                        d/dx = 1 - tanh(x)^2
// Fixed chunks in parallel; no reductions, so results are thread-independent.
// The GELUs use branch-free exp/erf below (libm's scalar tanhf/erff made GELU 13%
// of a GPT-2 step), written on 16-float vectors (GCC vector extensions: zmm with
// AVX-512; auto-vectorisation stopped at ymm and a true divide), tails padded
// into one vector so every element takes the same path; errors ~2e-7 absolute.
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/activation.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cpu/vec16.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {

namespace {

using cpu_io::as_f32;
using cpu_io::kBlock;

constexpr int64_t kGrain = int64_t{1} << 14;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

using vec::kV;
using vec::splat;
using vec::v16;
using vec::v16i;
using vec::vload;
using vec::vstore;
inline v16 vmin(v16 a, v16 b) { return a < b ? a : b; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
inline v16i bits(v16 v) {
  v16i i;
  std::memcpy(&i, &v, sizeof i);
  return i;
}
inline v16 from_bits(v16i i) {
  v16 v;
  std::memcpy(&v, &i, sizeof v);
  return v;
}

// 1 / d for d >= 1: the 14-bit estimate plus one Newton step (within an ulp or
// so; a divide costs about as much as the rest of a GELU).
inline v16 recip(v16 d) {
#if defined(__AVX512F__)
  // The zero-masked form with every lane on: the unmasked one trips GCC 12's
  // -Wmaybe-uninitialized (see float_io.h).
  const v16 r = reinterpret_cast<v16>(_mm512_maskz_rcp14_ps(0xffff, reinterpret_cast<__m512>(d)));
  return r * (2.0f - d * r);
#else
  return 1.0f / d;
#endif
}

// e^x: x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' degree-6 polynomial (relative
// error ~1e-7), times 2^n built in the exponent bits. Clamped to f32's range.
inline v16 fast_exp(v16 x) {
  x = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
  // Round to nearest by the 1.5 * 2^23 trick.
  const v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split in two for accuracy
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * from_bits((__builtin_convertvector(n, v16i) + 127) << 23);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1): absolute error ~2e-7 (relative error grows
// near 0, harmless inside GELU's 1 + tanh).
inline v16 fast_tanh(v16 u) { return 1.0f - 2.0f * recip(fast_exp(2.0f * u) + 1.0f); }

// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), odd
// extension; e_aa is exp(-x^2), which the GELU gradient shares with its pdf term.
inline v16 erf_with(v16 x, v16 e_aa) {
  const v16i sign = bits(x) & INT32_MIN;
  const v16 a = from_bits(bits(x) ^ sign);
  const v16 t = recip(1.0f + 0.3275911f * a);
  v16 p = splat(1.061405429f);
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const v16 e = 1.0f - p * t * e_aa;  // >= 0, so the sign is or-ed in
  return from_bits(bits(e) | sign);
}

inline v16 gelu_tanh_fwd(v16 x) {
  return 0.5f * x * (1.0f + fast_tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
}
inline v16 gelu_erf_fwd(v16 x) {
  const v16 z = x * kInvSqrt2;
  return 0.5f * x * (1.0f + erf_with(z, fast_exp(-(z * z))));
}
inline v16 gelu_tanh_grad(v16 x) {
  const v16 t = fast_tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
  const v16 du = kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
// Phi(x) + x phi(x): exp(-x^2 / 2) serves both erf(x / sqrt 2) and phi.
inline v16 gelu_erf_grad(v16 x) {
  const v16 z = x * kInvSqrt2;
  const v16 e = fast_exp(-(z * z));
  return 0.5f * (1.0f + erf_with(z, e)) + x * kInvSqrt2Pi * e;
}

// res[k] = f(x[k]) (unary) or f(x[k], d[k]) over [0, m) a vector at a time; the
// tail is padded with zeros into one vector.
template <typename F>
void map_v(const float* x, float* res, int64_t m, F f) {
  int64_t k = 0;
  for (; k + kV <= m; k += kV) vstore(res + k, f(vload(x + k)));
  if (k < m) {
    float bx[kV] = {}, br[kV];
    std::copy(x + k, x + m, bx);
    vstore(br, f(vload(bx)));
    std::copy(br, br + (m - k), res + k);
  }
}
template <typename F>
void map_v(const float* x, const float* d, float* res, int64_t m, F f) {
  int64_t k = 0;
  for (; k + kV <= m; k += kV) vstore(res + k, f(vload(x + k), vload(d + k)));
  if (k < m) {
    float bx[kV] = {}, bd[kV] = {}, br[kV];
    std::copy(x + k, x + m, bx);
    std::copy(d + k, d + m, bd);
    vstore(br, f(vload(bx), vload(bd)));
    std::copy(br, br + (m - k), res + k);
  }
}

float forward_one(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? x : 0.0f;
    case Activation::tanh:
      return std::tanh(x);
    default:  // the GELUs go through map_v
      return 0.0f;
  }
}

float derivative(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case Activation::tanh: {
      const float t = std::tanh(x);
      return 1.0f - t * t;
    }
    default:  // the GELUs go through map_v
      return 0.0f;
  }
}

// Per block: convert to f32, apply `fn(k, x)` into f32, round on store (f32
// output is written in place, no copy).
template <typename T, typename Fn>
void blocks(int64_t n, T* out, Fn fn) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    float buf[kBlock];
    for (int64_t i = lo; i < hi; i += kBlock) {
      const int64_t m = std::min(kBlock, hi - i);
      if constexpr (std::is_same_v<T, float>) {
        fn(i, m, out + i);
      } else {
        fn(i, m, buf);
        cpu_io::store_n(buf, out + i, m);
      }
    }
  });
}

template <typename T>
void forward_typed(Activation act, const T* x, T* y, int64_t n) {
  blocks(n, y, [&](int64_t i, int64_t m, float* res) {
    float bx[kBlock];
    const float* xv = as_f32(x + i, bx, m);
    if (act == Activation::relu) {  // the common case, kept branch-free and vectorised
      for (int64_t k = 0; k < m; ++k) res[k] = std::max(xv[k], 0.0f);
      return;
    }
    switch (act) {  // one loop per activation, so each vectorises
      case Activation::gelu_tanh:
        map_v(xv, res, m, [](v16 v) { return gelu_tanh_fwd(v); });
        break;
      case Activation::gelu_erf:
        map_v(xv, res, m, [](v16 v) { return gelu_erf_fwd(v); });
        break;
      default:
        for (int64_t k = 0; k < m; ++k) res[k] = forward_one(act, xv[k]);
    }
  });
}

template <typename T>
void backward_typed(Activation act, const T* x, const T* dy, T* dx, int64_t n) {
  blocks(n, dx, [&](int64_t i, int64_t m, float* res) {
    float bx[kBlock], bd[kBlock];
    const float* xv = as_f32(x + i, bx, m);
    const float* dv = as_f32(dy + i, bd, m);
    if (act == Activation::relu) {  // a select, vectorised; 0 for x <= 0 (and NaN x)
      for (int64_t k = 0; k < m; ++k) res[k] = xv[k] > 0.0f ? dv[k] : 0.0f;
      return;
    }
    switch (act) {
      case Activation::gelu_tanh:
        map_v(xv, dv, res, m, [](v16 v, v16 d) { return d * gelu_tanh_grad(v); });
        break;
      case Activation::gelu_erf:
        map_v(xv, dv, res, m, [](v16 v, v16 d) { return d * gelu_erf_grad(v); });
        break;
      default:
        for (int64_t k = 0; k < m; ++k) res[k] = dv[k] * derivative(act, xv[k]);
    }
  });
}

}  // namespace

void activation_forward(Activation act, const Tensor& x, Tensor& y) {
  const Device device = same_device("activation_forward", {&x, &y});
  require_dtype("activation_forward", "x", x, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(y.dtype() == x.dtype(), "activation_forward: y is {}, x is {}",
               dtype_name(y.dtype()), dtype_name(x.dtype()));
  require_numel("activation_forward", "y", y, x.numel());
  if (device.is_cuda()) return cuda_ops::activation_forward(act, x, y);
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_typed(act, static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()), x.numel());
  });
}

void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const Device device = same_device("activation_backward", {&x, &dy, &dx});
  require_dtype("activation_backward", "x", x, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype(),
               "activation_backward: x {}, dy {}, dx {} differ", dtype_name(x.dtype()),
               dtype_name(dy.dtype()), dtype_name(dx.dtype()));
  require_numel("activation_backward", "dy", dy, x.numel());
  require_numel("activation_backward", "dx", dx, x.numel());
  if (device.is_cuda()) return cuda_ops::activation_backward(act, x, dy, dx);
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    backward_typed(act, static_cast<const T*>(x.raw()), static_cast<const T*>(dy.raw()),
                   static_cast<T*>(dx.raw()), x.numel());
  });
}

}  // namespace dtrain::kernels
