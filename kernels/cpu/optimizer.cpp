// CPU fused optimizer steps (kernels/optimizer.h): one pass over the range in
// f32, in element order; the caller (src/optim) runs chunks on its threads.
// Built with -fno-math-errno so the sqrt loop vectorises (IEEE sqrt either way).
#include "kernels/optimizer.h"

#include <cmath>

#include "kernels/cuda_ops.h"

namespace dtrain::kernels {
namespace {

void sgd_plain(float* p, const float* g, int64_t n, const SgdStep& k) {
  for (int64_t i = 0; i < n; ++i) p[i] -= k.lr * (g[i] + k.wd * p[i]);
}

template <SgdMomentum M>
void sgd_momentum(float* p, const float* g, float* buf, int64_t n, const SgdStep& k) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + k.wd * p[i];
    const float b = k.mu * buf[i] + d;
    buf[i] = b;
    p[i] -= k.lr * (M == SgdMomentum::nesterov ? d + k.mu * b : b);
  }
}

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamStep& k) {
  const float step_size = k.lr / k.bc1;
  const float keep = 1.0f - k.lr * k.wd;
  for (int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + k.one_minus_b1 * g[i];
    v[i] = k.b2 * v[i] + k.one_minus_b2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / k.sqrt_bc2 + k.eps;
    p[i] = p[i] * keep - step_size * (m[i] / denom);
  }
}

}  // namespace

void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum) {
  constexpr std::string_view op = "sgd_step";
  const Device device = same_device(op, {&p, &g, &momentum});
  require_dtype(op, "p", p, {DType::f32});
  require_dtype(op, "g", g, {DType::f32});
  require_numel(op, "g", g, p.numel());
  if (k.momentum != SgdMomentum::none) {
    require_dtype(op, "momentum", momentum, {DType::f32});
    require_numel(op, "momentum", momentum, p.numel());
  }
  if (device.is_cuda()) return cuda_ops::sgd_step(k, p, g, momentum);
  const int64_t n = p.numel();
  switch (k.momentum) {
    case SgdMomentum::none:
      return sgd_plain(p.data<float>(), g.data<float>(), n, k);
    case SgdMomentum::heavy_ball:
      return sgd_momentum<SgdMomentum::heavy_ball>(p.data<float>(), g.data<float>(),
                                                   momentum.data<float>(), n, k);
    case SgdMomentum::nesterov:
      return sgd_momentum<SgdMomentum::nesterov>(p.data<float>(), g.data<float>(),
                                                 momentum.data<float>(), n, k);
  }
}

void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v) {
  constexpr std::string_view op = "adamw_step";
  const Device device = same_device(op, {&p, &g, &m, &v});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&p, &g, &m, &v}) {
    require_dtype(op, "p/g/m/v", *t, {DType::f32});
    require_numel(op, "p/g/m/v", *t, p.numel());
  }
  if (device.is_cuda()) return cuda_ops::adamw_step(k, p, g, m, v);
  adamw(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(), k);
}

}  // namespace dtrain::kernels
