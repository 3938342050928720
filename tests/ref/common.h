// Small helpers shared by the fp64 reference kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain::ref {

using Values = std::vector<double>;

// Plain left-to-right sum of n values.
double sum(const double* x, int64_t n);

}  // namespace dtrain::ref
