// fp64 reference batch normalisation over x viewed as [N, C, HW]: training
// forward (batch statistics, running-stat update), inference forward, and the
// backward of the training forward. Two-pass mean / variance, no fusion.
#pragma once

#include "kernels/batchnorm.h"

namespace dtrain::ref {

// x [N, C, HW] -> y; running_mean/var [C] updated in place; save_mean/save_invstd [C]
void batch_norm_forward_train(const kernels::BatchNormArgs& a, const double* x, const double* gamma,
                              const double* beta, double* y, double* running_mean,
                              double* running_var, double* save_mean, double* save_invstd);
void batch_norm_forward_infer(const kernels::BatchNormArgs& a, const double* x, const double* gamma,
                              const double* beta, const double* running_mean,
                              const double* running_var, double* y);
// -> dx [N, C, HW], dgamma, dbeta [C]
void batch_norm_backward(const kernels::BatchNormArgs& a, const double* x, const double* dy,
                         const double* gamma, const double* save_mean, const double* save_invstd,
                         double* dx, double* dgamma, double* dbeta);

}  // namespace dtrain::ref
