// Shared by the .cu files: launch geometry (grid-stride loops), device-side
// f32 / f16 / bf16 loads and stores (f32 maths, stores rounded to nearest
// even), and the dtype dispatch from a runtime DType to a storage type.
// Compiled by nvcc as C++17, so it sees only core/dtype.h of the C++ side.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.cuh"

namespace dtrain::kernels::cuda_ops {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill an H100/H200
// (132 SMs x 16 resident blocks of 256 threads) without a huge grid.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 132 * 16)));
}

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls fn(Tag<T>{}) with T the device storage type of a float dtype.
template <typename Fn>
void dispatch_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32:
      return fn(Tag<float>{});
    case DType::f16:
      return fn(Tag<__half>{});
    case DType::bf16:
      return fn(Tag<__nv_bfloat16>{});
    default:
      throw ::dtrain::Error(
          ::fmt::format("CUDA kernel: dtype {} is not f32, f16 or bf16", static_cast<int>(t)));
  }
}

}  // namespace dtrain::kernels::cuda_ops
