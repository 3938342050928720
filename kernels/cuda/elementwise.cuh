// Host launchers of kernels/cuda/elementwise.cu: binary arithmetic, scale,
// fill, bias-add and its backward, and the k == 0 GEMM epilogue (C = beta C
// over strided batches). f32 / f16 / bf16 storage, f32 maths; raw device
// pointers, enqueued on `stream`; no allocation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

enum class BinaryOp : uint8_t {
  add,   // out = a + b
  mul,   // out = a * b
  axpy,  // out = b + alpha * a (out may be b)
};

void launch_binary(BinaryOp op, DType dtype, float alpha, const void* a, const void* b, void* out,
                   int64_t n, cudaStream_t stream);
void launch_scale(DType dtype, float alpha, const void* x, void* out, int64_t n,
                  cudaStream_t stream);
void launch_fill(DType dtype, void* x, float value, int64_t n, cudaStream_t stream);
// x, y: [outer, channels, inner]; bias: [channels]
void launch_bias_add(DType dtype, const void* x, const void* bias, void* y, int64_t outer,
                     int64_t channels, int64_t inner, cudaStream_t stream);
// dbias[c] = sum over outer, inner of dy, in the CPU's order (outer, then inner), f32
void launch_bias_add_backward(DType dtype, const void* dy, void* dbias, int64_t outer,
                              int64_t channels, int64_t inner, cudaStream_t stream);
// c[b * stride + i] = beta * c[...] for b < batch, i < count; beta == 0 writes 0 (C not read)
void launch_scale_batches(DType dtype, void* c, int64_t batch, int64_t count, int64_t stride,
                          float beta, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
