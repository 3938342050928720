// Host launchers of kernels/cuda/compress.cu (gradient compression, see
// kernels/compress.h): raw device pointers, the caller's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::kernels::cuda_ops {

// Workspace of launch_topk for n entries: radix-sort keys and indices (double
// buffered) and CUB's temporary storage, each 256-byte aligned.
size_t topk_temp_bytes(int64_t n);
void launch_topk(const float* x, int64_t n, int64_t k, int32_t* indices, float* values,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream);
void launch_scatter_add(const int32_t* indices, const float* values, int64_t m, int64_t segment,
                        float* out, int64_t n, cudaStream_t stream);
void launch_clear_at(const int32_t* indices, int64_t m, float* x, int64_t n, cudaStream_t stream);
void launch_sign_pack(const float* x, int64_t n, int64_t chunk, uint32_t* words, float* scales,
                      cudaStream_t stream);
void launch_sign_unpack(const uint32_t* words, const float* scales, int64_t n, int64_t chunk,
                        float* out, bool add, cudaStream_t stream);
void launch_orthonormalize_columns(float* a, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
