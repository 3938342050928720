// Global-norm gradient clipping over one flat f32 gradient buffer (PyTorch's
// clip_grad_norm_ with the L2 norm), plus the two halves a sharded caller needs to
// all-reduce the sum of squares in between. Does not skip steps: the caller decides.
#pragma once

#include "core/tensor.h"

namespace dtrain::optim {

// sum of g^2 over grads (f32 [N], host or CUDA) in double: on the host, fixed blocks of
// kClipBlock elements, block sums added in block order, so the result is the same on
// any thread count; on CUDA the square of the reduce kernel's L2 norm (deterministic too).
inline constexpr int64_t kClipBlock = 16384;
double grad_sum_squares(const Tensor& grads);

// The clipping factor max_norm / (norm + 1e-6) when it is below 1, else 1 (also for a
// non-finite norm): the multiplier a fused optimizer step applies to the gradients.
double clip_factor(double norm, double max_norm);

// grads *= max_norm / (norm + 1e-6) when that factor is below 1; otherwise untouched.
// A non-finite norm leaves grads untouched. Returns whether it scaled.
enum class Clipped : uint8_t { no, yes };
Clipped clip_to_norm(Tensor& grads, double norm, double max_norm);

// Returns the global L2 norm before clipping (inf / nan when grads hold them, in which
// case grads are left as they are and the caller skips the step).
double clip_grad_norm(Tensor& grads, double max_norm);

}  // namespace dtrain::optim
