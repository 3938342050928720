// kernels/cuda_ops.h for the fused optimizer steps: unwraps the (already
// checked) Tensors and step scalars into the launchers of
// kernels/cuda/optimizer.cuh on the device's backend stream.
#include "kernels/cuda/context.h"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum, Tensor* copy) {
  const SgdScalars s{k.lr, k.wd, k.mu, static_cast<int>(k.momentum), k.gscale};
  float* buf = k.momentum == SgdMomentum::none ? nullptr : f32(momentum);
  launch_sgd_step(s, p.dtype(), p.raw(), f32(g), buf, copy ? copy->dtype() : DType::f32,
                  copy ? copy->raw() : nullptr, p.numel(), stream_of(p));
}

namespace {

AdamScalars scalars(const AdamStep& k) {
  return {k.b1,       k.one_minus_b1, k.b2, k.one_minus_b2, k.bc1,
          k.sqrt_bc2, k.eps,          k.lr, k.wd,           k.gscale};
}

const int64_t* i64(const Tensor& t) { return static_cast<const int64_t*>(t.raw()); }

}  // namespace

void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor* copy) {
  launch_adamw_step(scalars(k), p.dtype(), p.raw(), f32(g), f32(m), f32(v),
                    copy ? copy->dtype() : DType::f32, copy ? copy->raw() : nullptr, p.numel(),
                    stream_of(p));
}

void ema_update(float rest, const Tensor& p, Tensor& ema) {
  launch_ema_update(rest, f32(p), f32(ema), p.numel(), stream_of(p));
}

void lamb_moments(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& p,
                  const Tensor& g, Tensor& m, Tensor& v, Tensor& sums) {
  launch_lamb_moments(scalars(k), i64(ranges), f32(wd), wd.numel(), f32(p), f32(g), f32(m), f32(v),
                      static_cast<double*>(sums.raw()), stream_of(p));
}

void lamb_update(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& step,
                 Tensor& p, const Tensor& m, const Tensor& v) {
  launch_lamb_update(scalars(k), i64(ranges), f32(wd), f32(step), wd.numel(), f32(p), f32(m),
                     f32(v), stream_of(p));
}

}  // namespace dtrain::kernels::cuda_ops
