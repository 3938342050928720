// Reference whole-tensor reductions in fp64 (the spec for kernels/reduce.h).
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

enum class Reduction : uint8_t { sum, mean, l2_norm, max_abs, has_inf_or_nan };

// x [n] -> one value. mean of 0 elements is NaN; max_abs is NaN if any x is NaN;
// has_inf_or_nan is 1 or 0.
double reduce(Reduction op, const double* x, int64_t n);

}  // namespace dtrain::ref
