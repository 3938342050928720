// Whole-tensor reductions to one f32 value: sum, mean, L2 norm, max-abs, and
// has-inf-or-nan (the loss scaler's overflow test). Partial sums are taken over
// fixed blocks and combined in block order, so results do not depend on the
// thread count; accumulation is in double for sum/mean/L2.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class Reduction : uint8_t { sum, mean, l2_norm, max_abs, has_inf_or_nan };

size_t reduce_workspace_bytes(int64_t numel);

// x any float dtype -> out f32 [1]. has_inf_or_nan writes 1.0 or 0.0.
// max_abs of a tensor holding NaN is NaN.
void reduce(Reduction op, const Tensor& x, Tensor& out, Workspace ws);

}  // namespace dtrain::kernels
