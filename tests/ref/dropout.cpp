// Textbook dropout: one Philox draw per element, in order.
#include "ref/dropout.h"

#include "core/rng.h"

namespace dtrain::ref {

void dropout(const Dropout& a, int64_t n, const double* x, double* y, double* mask) {
  const Philox rng(a.seed, a.stream);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rng.uniform(a.offset + static_cast<uint64_t>(i)) >= a.p;
    mask[i] = keep ? 1.0 : 0.0;
    y[i] = keep ? x[i] / (1.0 - a.p) : 0.0;
  }
}

double kept_fraction(const Dropout& a, int64_t n) {
  const Philox rng(a.seed, a.stream);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) kept += rng.uniform(a.offset + static_cast<uint64_t>(i)) >= a.p;
  return static_cast<double>(kept) / static_cast<double>(n);
}

}  // namespace dtrain::ref
