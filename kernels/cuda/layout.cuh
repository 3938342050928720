// Host launcher of kernels/cuda/layout.cu: permute of a contiguous tensor of
// rank <= 6, any dtype (elements of 1, 2, 4 or 8 bytes are moved, not
// interpreted). Raw device pointers, enqueued on `stream`; no allocation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::kernels::cuda_ops {

constexpr int kMaxPermuteRank = 6;

// y[i0..i{r-1}] = x[sum_k i_k * src_stride[k]], out_dim: y's dims.
struct PermuteGeometry {
  int rank = 0;
  int64_t out_dim[kMaxPermuteRank] = {};
  int64_t src_stride[kMaxPermuteRank] = {};
};

void launch_permute(const PermuteGeometry& g, size_t elem_bytes, const void* x, void* y, int64_t n,
                    cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
