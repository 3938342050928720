// Deterministic sums of squares in double (host code: the CPU LAMB kernel and
// src/optim's clipping share it): 8 fixed lanes per call, lanes added in
// lane order, so the bits depend on the data and the call's range alone. Callers cut
// long ranges into fixed blocks and add the block results in block order.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

// sum_i x[i]^2 over [0, n), accumulated in double. The lane loop is what lets the
// compiler vectorise without reassociating one running sum.
inline double sum_squares(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lane[j] += v * v;
    }
  for (; i < n; ++i) {
    const double v = x[i];
    lane[0] += v * v;
  }
  double total = 0;
  for (int j = 0; j < kLanes; ++j) total += lane[j];
  return total;
}

}  // namespace dtrain::kernels
