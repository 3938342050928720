// Host launchers of kernels/cuda/batchnorm.cu: batch normalisation over
// x [N, C, HW] per channel (training with batch statistics and running-stat
// update, inference, backward), the CPU's semantics. Raw device pointers; x, y,
// dy, dx in `dtype` (f32 / f16 / bf16), per-channel tensors f32; on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

struct BnShape {
  int64_t n, c, hw;
  float eps, momentum;
};

void launch_batch_norm_forward_train(DType dtype, const BnShape& s, const void* x,
                                     const float* gamma, const float* beta, void* y,
                                     float* running_mean, float* running_var, float* save_mean,
                                     float* save_invstd, cudaStream_t stream);
void launch_batch_norm_forward_infer(DType dtype, const BnShape& s, const void* x,
                                     const float* gamma, const float* beta,
                                     const float* running_mean, const float* running_var, void* y,
                                     cudaStream_t stream);
void launch_batch_norm_backward(DType dtype, const BnShape& s, const void* x, const void* dy,
                                const float* gamma, const float* save_mean,
                                const float* save_invstd, void* dx, float* dgamma, float* dbeta,
                                cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
