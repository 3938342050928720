// Host launchers of kernels/cuda/optimizer.cu: the fused SGD and AdamW steps of
// kernels/optimizer.h over n contiguous f32 elements, in place, on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::kernels::cuda_ops {

// Plain values of kernels::SgdStep / AdamStep (momentum: 0 none, 1 heavy ball, 2 Nesterov).
struct SgdScalars {
  float lr, wd, mu;
  int momentum;
};
struct AdamScalars {
  float b1, one_minus_b1, b2, one_minus_b2, bc1, sqrt_bc2, eps, lr, wd;
};

void launch_sgd_step(const SgdScalars& k, float* p, const float* g, float* momentum, int64_t n,
                     cudaStream_t stream);
void launch_adamw_step(const AdamScalars& k, float* p, const float* g, float* m, float* v,
                       int64_t n, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
