// kernels/cuda_ops.h for the fused optimizer steps: unwraps the (already
// checked) Tensors and step scalars into the launchers of
// kernels/cuda/optimizer.cuh on the device's backend stream.
#include "kernels/cuda/context.h"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum) {
  const SgdScalars s{k.lr, k.wd, k.mu, static_cast<int>(k.momentum)};
  float* buf = k.momentum == SgdMomentum::none ? nullptr : f32(momentum);
  launch_sgd_step(s, f32(p), f32(g), buf, p.numel(), stream_of(p));
}

void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v) {
  const AdamScalars s{k.b1,  k.one_minus_b1, k.b2, k.one_minus_b2, k.bc1, k.sqrt_bc2,
                      k.eps, k.lr,           k.wd};
  launch_adamw_step(s, f32(p), f32(g), f32(m), f32(v), p.numel(), stream_of(p));
}

}  // namespace dtrain::kernels::cuda_ops
