// Reference inverted dropout (the spec for kernels/dropout.h): element i is
// kept iff Philox(seed, stream).uniform(offset + i) >= p; kept values scale by
// 1/(1-p). Uses core/rng.h's Philox, the definition of the random stream.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

struct Dropout {
  double p = 0.0;
  uint64_t seed = 0, stream = 0, offset = 0;
};

// x [n] -> y [n], mask [n] (1 kept, 0 dropped)
void dropout(const Dropout& a, int64_t n, const double* x, double* y, double* mask);
// Fraction of the n elements from `offset` that dropout keeps.
double kept_fraction(const Dropout& a, int64_t n);

}  // namespace dtrain::ref
