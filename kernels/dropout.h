// Inverted dropout keyed by the Philox RNG: element i of the tensor is kept
// when Philox(seed, stream).uniform(offset + i) >= p, and kept values are scaled
// by 1/(1-p). Element i's decision depends only on (seed, stream, offset + i),
// so the CUDA backend draws the same mask. The mask (u8, 1 = kept) is saved.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

struct DropoutArgs {
  float p = 0.0f;  // drop probability, in [0, 1)
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;
};

void dropout_forward(const DropoutArgs& args, const Tensor& x, Tensor& y, Tensor& mask);
void dropout_backward(const DropoutArgs& args, const Tensor& dy, const Tensor& mask, Tensor& dx);

}  // namespace dtrain::kernels
