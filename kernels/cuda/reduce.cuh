// Host launcher of kernels/cuda/reduce.cu: whole-tensor sum, mean, L2 norm,
// max-abs and has-inf-or-nan into one f32 on the device. Same blocking as the
// CPU (kReduceBlock elements per partial, partials in double, combined in block
// order), so the workspace of reduce_workspace_bytes() fits both backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// Same values as kernels::Reduction (checked in ops.cpp).
enum class ReduceKind : uint8_t { sum, mean, l2_norm, max_abs, has_inf_or_nan };

constexpr int64_t kReduceBlock = 4096;  // = kernels/cpu/reduce.cpp

// x: [n] f32/f16/bf16/f64; partials: ceil(n / kReduceBlock) doubles; out: one f32.
void launch_reduce(ReduceKind op, DType dtype, const void* x, int64_t n, double* partials,
                   float* out, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
