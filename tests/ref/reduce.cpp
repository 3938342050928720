// Textbook fp64 reductions: one left-to-right loop each.
#include "ref/reduce.h"

#include <cmath>
#include <limits>

namespace dtrain::ref {

double reduce(Reduction op, const double* x, int64_t n) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double r = 0.0;
  switch (op) {
    case Reduction::sum:
      return sum(x, n);
    case Reduction::mean:
      return n == 0 ? nan : sum(x, n) / static_cast<double>(n);
    case Reduction::l2_norm:
      for (int64_t i = 0; i < n; ++i) r += x[i] * x[i];
      return std::sqrt(r);
    case Reduction::max_abs:
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(x[i])) return nan;
        r = std::max(r, std::abs(x[i]));
      }
      return r;
    case Reduction::has_inf_or_nan:
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return 1.0;
      }
      return 0.0;
  }
  return nan;
}

}  // namespace dtrain::ref
