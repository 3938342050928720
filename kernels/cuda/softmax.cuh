// Host launchers of kernels/cuda/softmax.cu: softmax over the last dim and the
// fused softmax + cross-entropy (ignore index, label smoothing), f32 maths on
// f32/f16/bf16 storage, the CPU's formulas (kernels/cpu/softmax.cpp). Targets
// stay on the device: one outside [0, classes) that is not the ignore index
// makes the loss NaN and its dlogits row NaN (the CPU throws instead).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// x [rows, cols] -> y [rows, cols]
void launch_softmax_forward(DType dtype, int64_t rows, int64_t cols, const void* x, void* y,
                            cudaStream_t stream);
// y, dy [rows, cols] -> dx = y (dy - sum(dy y))
void launch_softmax_backward(DType dtype, int64_t rows, int64_t cols, const void* y, const void* dy,
                             void* dx, cudaStream_t stream);

struct XentShape {
  int64_t rows = 1, classes = 1;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
};

// logits [rows, classes], targets i32 [rows] -> loss f32 [1], lse f32 [rows]
void launch_xent_forward(DType dtype, const XentShape& s, const void* logits,
                         const int32_t* targets, float* loss, float* lse, cudaStream_t stream);
// -> dlogits [rows, classes]
void launch_xent_backward(DType dtype, const XentShape& s, const void* logits,
                          const int32_t* targets, const float* lse, const float* dloss,
                          void* dlogits, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
