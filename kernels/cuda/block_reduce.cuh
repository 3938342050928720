// Deterministic block-wide reductions for the row kernels (layer norm, softmax):
// a fixed butterfly inside each warp, then warp 0 folds the per-warp values in
// warp order. The order depends only on blockDim.x, never on timing, so a row's
// result is bit-identical run to run. blockDim.x must be a multiple of 32.
#pragma once

#include <cuda_runtime.h>

namespace dtrain::kernels::cuda_ops {

// float or double (LAMB's norms are summed in double).
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
// std::max(a, b) = (a < b) ? b : a: a NaN in b never wins, as on the CPU.
struct MaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};

template <typename T, typename Op>
__device__ inline T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread gets the result. `shared` holds 32 values; the caller may reuse
// it after the call (a barrier ends the function).
template <typename T, typename Op>
__device__ inline T block_reduce(T v, Op op, T identity, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : identity;
    v = warp_reduce(v, op);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

}  // namespace dtrain::kernels::cuda_ops
