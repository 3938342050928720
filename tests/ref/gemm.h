// fp64 reference for batched, strided GEMM (kernels/gemm.h): three nested loops
// per batch, no blocking. The spec the oneDNN kernel is checked against.
#pragma once

#include "kernels/gemm.h"

namespace dtrain::ref {

// a, b, c: flat element arrays laid out as GemmArgs describes (strides, 0 =
// broadcast). c is read when beta != 0 and overwritten.
void gemm(const kernels::GemmArgs& args, const double* a, const double* b, double* c);

}  // namespace dtrain::ref
