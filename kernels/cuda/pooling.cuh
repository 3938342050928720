// Host launchers of kernels/cuda/pooling.cu: 2-D max / average pooling over
// NCHW planes (forward saves the max's flat index per plane, i32) and global
// average pooling, with the CPU's semantics and summation order. Raw device
// pointers; enqueued on `stream`; no allocation, no atomics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// The fields of kernels::Pool2dArgs, as plain values nvcc can take.
struct PoolShape {
  int64_t planes, h, w, out_h, out_w;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  bool count_padding;  // PadCount::include
};

enum class PoolOp : uint8_t { max, avg };

// x [planes, h, w] -> y [planes, out_h, out_w]; argmax (max only, else null) like y, i32.
void launch_pool2d_forward(PoolOp op, DType dtype, const PoolShape& s, const void* x, void* y,
                           int32_t* argmax, cudaStream_t stream);
// dy [planes, out_h, out_w] -> dx [planes, h, w] (overwritten): each input element sums the
// windows that contain it in (oh, ow) order.
void launch_pool2d_backward(PoolOp op, DType dtype, const PoolShape& s, const void* dy,
                            const int32_t* argmax, void* dx, cudaStream_t stream);
// x [planes, hw] -> y [planes]; dy [planes] -> dx [planes, hw].
void launch_global_avg_pool_forward(DType dtype, int64_t planes, int64_t hw, const void* x, void* y,
                                    cudaStream_t stream);
void launch_global_avg_pool_backward(DType dtype, int64_t planes, int64_t hw, const void* dy,
                                     void* dx, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
