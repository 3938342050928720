// Reference elementwise ops, bias-add and casts in fp64 (the spec for
// kernels/elementwise.h). The cast reference rounds to a target format with
// its own frexp/ldexp arithmetic and never calls core/dtype.h's conversions.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ref/common.h"

namespace dtrain::ref {

// x [outer, channels, inner], bias [channels] -> y [outer, channels, inner]
void bias_add(int64_t outer, int64_t channels, int64_t inner, const double* x, const double* bias,
              double* y);
// dy [outer, channels, inner] -> dbias [channels]
void bias_add_backward(int64_t outer, int64_t channels, int64_t inner, const double* dy,
                       double* dbias);

// v rounded to nearest, ties to even, in a binary format with `precision`
// significand bits (implicit bit included), smallest normal exponent emin and
// largest exponent emax; subnormals, overflow to Inf, NaN and signed zero kept.
double round_to_format(double v, int precision, int emin, int emax);
// round_to_format with the parameters of dst (f32, f16, bf16; f64 is identity).
double round_to_dtype(double v, DType dst);

}  // namespace dtrain::ref
