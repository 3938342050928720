// fp64 reference 2-D max / average pooling (NCHW) and global average pooling,
// forward and backward, as direct loops over each output window.
#pragma once

#include "kernels/pooling.h"

namespace dtrain::ref {

// x [N, C, H, W] -> y [N, C, OH, OW]; argmax (flat index into the H*W plane,
// first maximum wins, NaN beats everything) filled for max pooling only.
void pool2d_forward(kernels::PoolKind kind, const kernels::Pool2dArgs& a, const double* x,
                    double* y, double* argmax);
// dy [N, C, OH, OW] -> dx [N, C, H, W]; max routes dy to argmax.
void pool2d_backward(kernels::PoolKind kind, const kernels::Pool2dArgs& a, const double* dy,
                     const double* argmax, double* dx);
// x [N, C, HW] -> y [N, C]
void global_avg_pool_forward(int64_t n, int64_t c, int64_t hw, const double* x, double* y);
// dy [N, C] -> dx [N, C, HW]
void global_avg_pool_backward(int64_t n, int64_t c, int64_t hw, const double* dy, double* dx);

}  // namespace dtrain::ref
