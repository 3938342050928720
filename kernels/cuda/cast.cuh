// Host launcher of kernels/cuda/cast.cu: f32, f16, bf16, f64, i32, i64, u8 to
// f32, f16, bf16 or f64, each value rounded once to nearest even (the
// semantics of kernels/cpu/cast.cpp). Raw device pointers, on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

void launch_cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n,
                 cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
