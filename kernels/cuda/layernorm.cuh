// Host launchers of kernels/cuda/layernorm.cu: layer normalisation over the
// last dim of x [rows, cols], f32 maths on f32/f16/bf16 storage, the CPU's
// formulas (kernels/cpu/layernorm.cpp); gamma/beta and dgamma/dbeta are f32 for
// every dtype. dgamma/dbeta need no workspace and are deterministic (each
// column's sum is folded in a fixed order, no atomics).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// x [rows, cols], gamma/beta f32 [cols] -> y [rows, cols], mean/rstd f32 [rows]
void launch_layer_norm_forward(DType dtype, int64_t rows, int64_t cols, float eps, const void* x,
                               const float* gamma, const float* beta, void* y, float* mean,
                               float* rstd, cudaStream_t stream);
// -> dx [rows, cols], dgamma/dbeta f32 [cols] (overwritten)
void launch_layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x,
                                const void* dy, const float* gamma, const float* mean,
                                const float* rstd, void* dx, float* dgamma, float* dbeta,
                                cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
