// Host launchers of kernels/cuda/dropout.cu: inverted dropout keyed by the
// Philox stream of src/core/rng.h (kernels/cuda/philox.cuh), so the u8 mask
// (1 = kept) equals the CPU's bit for bit: element i is kept iff
// uniform(offset + i) >= p; kept values are scaled by 1/(1-p) in f32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

struct DropoutDraw {
  float p = 0.0f;
  uint64_t seed = 0, stream = 0, offset = 0;
};

// x [n] -> y [n], mask u8 [n]
void launch_dropout_forward(DType dtype, const DropoutDraw& d, const void* x, int64_t n, void* y,
                            uint8_t* mask, cudaStream_t stream);
// dy [n], mask u8 [n] -> dx [n] = mask ? dy / (1 - p) : 0
void launch_dropout_backward(DType dtype, float p, const void* dy, const uint8_t* mask, int64_t n,
                             void* dx, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
