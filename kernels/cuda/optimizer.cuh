// Host launchers of kernels/cuda/optimizer.cu: the fused SGD and AdamW steps of
// kernels/optimizer.h over n contiguous elements, and LAMB's two passes over
// a chunk table, in place, on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// Plain values of kernels::SgdStep / AdamStep (momentum: 0 none, 1 heavy ball, 2 Nesterov).
struct SgdScalars {
  float lr, wd, mu;
  int momentum;
  float gscale;
};
struct AdamScalars {
  float b1, one_minus_b1, b2, one_minus_b2, bc1, sqrt_bc2, eps, lr, wd, gscale;
};

// p: p_dtype (f32, f16, bf16) in place; copy: nullptr, or copy_dtype receiving the new p.
void launch_sgd_step(const SgdScalars& k, DType p_dtype, void* p, const float* g, float* momentum,
                     DType copy_dtype, void* copy, int64_t n, cudaStream_t stream);
void launch_adamw_step(const AdamScalars& k, DType p_dtype, void* p, const float* g, float* m,
                       float* v, DType copy_dtype, void* copy, int64_t n, cudaStream_t stream);

// ema += rest * (p - ema) over n f32 elements (optimizer.ema).
void launch_ema_update(float rest, const float* p, float* ema, int64_t n, cudaStream_t stream);

// LAMB's two passes over a chunk table (ranges [C, 2], wd [C]): one block per chunk.
// sums [C, 2] = (sum p^2, sum u^2); step [C] = lr x trust ratio. k.wd, k.lr unused.
void launch_lamb_moments(const AdamScalars& k, const int64_t* ranges, const float* wd,
                         int64_t chunks, const float* p, const float* g, float* m, float* v,
                         double* sums, cudaStream_t stream);
void launch_lamb_update(const AdamScalars& k, const int64_t* ranges, const float* wd,
                        const float* step, int64_t chunks, float* p, const float* m, const float* v,
                        cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
