// Reference layer normalisation over the last dim in fp64 (the spec for
// kernels/layernorm.h): forward with saved mean and 1/sqrt(var + eps), and the
// analytic backward.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

// x [rows, cols], gamma/beta [cols] -> y [rows, cols], mean/rstd [rows]
void layer_norm(int64_t rows, int64_t cols, double eps, const double* x, const double* gamma,
                const double* beta, double* y, double* mean, double* rstd);
// dy [rows, cols] -> dx [rows, cols], dgamma/dbeta [cols]
void layer_norm_backward(int64_t rows, int64_t cols, double eps, const double* x,
                         const double* gamma, const double* dy, double* dx, double* dgamma,
                         double* dbeta);

}  // namespace dtrain::ref
