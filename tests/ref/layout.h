// Reference permute: y[i0, ..., ir] = x at the index whose dim perm[k] is i_k.
#pragma once

#include <span>

#include "core/shape.h"
#include "ref/common.h"

namespace dtrain::ref {

// x with shape `x_shape` -> y with shape [x_shape[perm[0]], ..., x_shape[perm[r-1]]]
void permute(const Shape& x_shape, std::span<const int> perm, const double* x, double* y);

}  // namespace dtrain::ref
