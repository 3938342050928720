// fp64 reference 2-D convolution (cross-correlation), NCHW / KCRS, with
// stride, padding, dilation and groups: forward and both backward passes as
// direct loops over the definition. No blocking, no im2col.
#pragma once

#include "kernels/conv.h"

namespace dtrain::ref {

// x [N, C, H, W], w [K, C/g, R, S] -> y [N, K, OH, OW]
void conv2d_forward(const kernels::Conv2dArgs& a, const double* x, const double* w, double* y);
// dy [N, K, OH, OW], w -> dx [N, C, H, W]
void conv2d_backward_data(const kernels::Conv2dArgs& a, const double* dy, const double* w,
                          double* dx);
// x, dy -> dw [K, C/g, R, S]
void conv2d_backward_filter(const kernels::Conv2dArgs& a, const double* x, const double* dy,
                            double* dw);

}  // namespace dtrain::ref
