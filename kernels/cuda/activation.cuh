// Host launchers of kernels/cuda/activation.cu: ReLU, GELU (tanh and erf) and
// tanh, forward and backward, on f32 / f16 / bf16 storage with f32 maths.
// Raw device pointers; enqueued on `stream`; no allocation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// Same values as kernels::Activation (checked where the two meet, in ops.cpp).
enum class ActKind : uint8_t { relu, gelu_tanh, gelu_erf, tanh };

void launch_activation_forward(ActKind act, DType dtype, const void* x, void* y, int64_t n,
                               cudaStream_t stream);
void launch_activation_backward(ActKind act, DType dtype, const void* x, const void* dy, void* dx,
                                int64_t n, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
