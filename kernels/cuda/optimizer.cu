// CUDA fused optimizer steps: the CPU loops of kernels/cpu/optimizer.cpp with
// one element per thread iteration (grid-stride), the same f32 expressions
// (IEEE sqrtf and division; nvcc may fuse a multiply-add, so values can differ
// from the CPU's in the last bit).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/optimizer.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

__global__ void sgd_kernel(SgdScalars k, float* p, const float* g, float* buf, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float d = g[i] + k.wd * p[i];
    if (k.momentum == 0) {
      p[i] -= k.lr * d;
      continue;
    }
    const float b = k.mu * buf[i] + d;
    buf[i] = b;
    p[i] -= k.lr * (k.momentum == 2 ? d + k.mu * b : b);
  }
}

__global__ void adamw_kernel(AdamScalars k, float* p, const float* g, float* m, float* v,
                             int64_t n) {
  const float step_size = k.lr / k.bc1;
  const float keep = 1.0f - k.lr * k.wd;
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float gi = g[i];
    const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
    const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / k.sqrt_bc2 + k.eps;
    p[i] = p[i] * keep - step_size * (mi / denom);
  }
}

}  // namespace

void launch_sgd_step(const SgdScalars& k, float* p, const float* g, float* momentum, int64_t n,
                     cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(k, p, g, momentum, n);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_adamw_step(const AdamScalars& k, float* p, const float* g, float* m, float* v,
                       int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(k, p, g, m, v, n);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace dtrain::kernels::cuda_ops
