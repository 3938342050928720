// CPU activations, forward and backward, in f32 on f32/f16/bf16 storage:
//   relu(x)      = max(x, 0)                       d/dx = [x > 0]
//   gelu_tanh(x) = x/2 (1 + tanh(u)), u = k (x + c x^3), k = sqrt(2/pi), c = 0.044715
//                  d/dx = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2), t = tanh(u)
//   gelu_erf(x)  = x/2 (1 + erf(x / sqrt 2))       d/dx = Phi(x) + x phi(x)
//   tanh(x)                                        d/dx = 1 - tanh(x)^2
// Fixed chunks in parallel; no reductions, so results are thread-independent.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/activation.h"
#include "kernels/cpu/float_io.h"

namespace dtrain::kernels {

namespace {

using cpu_io::as_f32;
using cpu_io::kBlock;

constexpr int64_t kGrain = int64_t{1} << 14;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

float forward_one(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? x : 0.0f;
    case Activation::gelu_tanh:
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
    case Activation::gelu_erf:
      return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
    case Activation::tanh:
      return std::tanh(x);
  }
  return 0.0f;
}

float derivative(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case Activation::gelu_tanh: {
      const float t = std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case Activation::gelu_erf:
      return 0.5f * (1.0f + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
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
    for (int64_t k = 0; k < m; ++k) res[k] = forward_one(act, xv[k]);
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
    for (int64_t k = 0; k < m; ++k) res[k] = dv[k] * derivative(act, xv[k]);
  });
}

}  // namespace

void activation_forward(Activation act, const Tensor& x, Tensor& y) {
  require_cpu("activation_forward", {&x, &y});
  require_dtype("activation_forward", "x", x, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(y.dtype() == x.dtype(), "activation_forward: y is {}, x is {}",
               dtype_name(y.dtype()), dtype_name(x.dtype()));
  require_numel("activation_forward", "y", y, x.numel());
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_typed(act, static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()), x.numel());
  });
}

void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  require_cpu("activation_backward", {&x, &dy, &dx});
  require_dtype("activation_backward", "x", x, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype(),
               "activation_backward: x {}, dy {}, dx {} differ", dtype_name(x.dtype()),
               dtype_name(dy.dtype()), dtype_name(dx.dtype()));
  require_numel("activation_backward", "dy", dy, x.numel());
  require_numel("activation_backward", "dx", dx, x.numel());
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    backward_typed(act, static_cast<const T*>(x.raw()), static_cast<const T*>(dy.raw()),
                   static_cast<T*>(dx.raw()), x.numel());
  });
}

}  // namespace dtrain::kernels
