// Shared reference helpers.
#include "ref/common.h"

namespace dtrain::ref {

double sum(const double* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace dtrain::ref
