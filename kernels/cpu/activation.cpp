// CPU activations, forward and backward, in f32 on f32/f16/bf16 storage:
//   relu(x)      = max(x, 0)                       d/dx = [x > 0]
//   gelu_tanh(x) = x/2 (1 + tanh(u)), u = k (x + c x^3), k = sqrt(2/pi), c = 0.044715
//                  d/dx = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2), t = tanh(u)
//   gelu_erf(x)  = x/2 (1 + erf(x / sqrt 2))       d/dx = Phi(x) + x phi(x)
//   tanh(x)                                        d/dx = 1 - tanh(x)^2
// Fixed chunks in parallel; no reductions, so results are thread-independent.
// The GELUs use branch-free exp/erf below (the compiler vectorises them; libm's
// scalar tanhf/erff made GELU 13% of a GPT-2 step); errors ~2e-7 absolute.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/parallel.h"
#include "kernels/activation.h"
#include "kernels/cpu/float_io.h"
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

// e^x: x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' degree-6 polynomial (relative
// error ~1e-7), times 2^n built in the exponent bits. Clamped to f32's range.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // Round to nearest by the 1.5 * 2^23 trick (std::floor does not vectorise here).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split in two for accuracy
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1): absolute error ~2e-7 (relative error grows
// near 0, harmless inside GELU's 1 + tanh).
inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

// erf by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), odd extension.
inline float fast_erf(float x) {
  const float a = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float e = 1.0f - p * t * fast_exp(-a * a);
  return std::copysign(e, x);
}

inline float gelu_tanh_fwd(float x) {
  return 0.5f * x * (1.0f + fast_tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
}
inline float gelu_erf_fwd(float x) { return 0.5f * x * (1.0f + fast_erf(x * kInvSqrt2)); }
inline float gelu_tanh_grad(float x) {
  const float t = fast_tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
inline float gelu_erf_grad(float x) {
  return 0.5f * (1.0f + fast_erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * fast_exp(-0.5f * x * x);
}

float forward_one(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? x : 0.0f;
    case Activation::gelu_tanh:
      return gelu_tanh_fwd(x);
    case Activation::gelu_erf:
      return gelu_erf_fwd(x);
    case Activation::tanh:
      return std::tanh(x);
  }
  return 0.0f;
}

float derivative(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case Activation::gelu_tanh:
      return gelu_tanh_grad(x);
    case Activation::gelu_erf:
      return gelu_erf_grad(x);
    case Activation::tanh: {
      const float t = std::tanh(x);
      return 1.0f - t * t;
    }
  }
  return 0.0f;
}

// Per block: convert to f32, apply `fn(k, x)` into f32, round on store.
template <typename T, typename Fn>
void blocks(int64_t n, T* out, Fn fn) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    float res[kBlock];
    for (int64_t i = lo; i < hi; i += kBlock) {
      const int64_t m = std::min(kBlock, hi - i);
      fn(i, m, res);
      cpu_io::store_n(res, out + i, m);
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
        for (int64_t k = 0; k < m; ++k) res[k] = gelu_tanh_fwd(xv[k]);
        break;
      case Activation::gelu_erf:
        for (int64_t k = 0; k < m; ++k) res[k] = gelu_erf_fwd(xv[k]);
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
        for (int64_t k = 0; k < m; ++k) res[k] = dv[k] * gelu_tanh_grad(xv[k]);
        break;
      case Activation::gelu_erf:
        for (int64_t k = 0; k < m; ++k) res[k] = dv[k] * gelu_erf_grad(xv[k]);
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
