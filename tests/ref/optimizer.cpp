// Textbook SGD (PyTorch's: d = g + wd p, b = mu b + d, Nesterov d + mu b) and
// AdamW (decoupled decay, bias-corrected moments), one element at a time.
#include "ref/optimizer.h"

#include <cmath>

namespace dtrain::ref {

void sgd_step(const SgdStep& k, int64_t n, double* p, const double* g, double* momentum) {
  for (int64_t i = 0; i < n; ++i) {
    double d = g[i] + k.wd * p[i];
    if (k.momentum != 0) {
      momentum[i] = k.mu * momentum[i] + d;
      d = k.momentum == 2 ? d + k.mu * momentum[i] : momentum[i];
    }
    p[i] -= k.lr * d;
  }
}

void adamw_step(const AdamStep& k, int64_t n, double* p, const double* g, double* m, double* v) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + k.one_minus_b1 * g[i];
    v[i] = k.b2 * v[i] + k.one_minus_b2 * g[i] * g[i];
    const double update = (m[i] / k.bc1) / (std::sqrt(v[i]) / k.sqrt_bc2 + k.eps);
    p[i] = p[i] * (1.0 - k.lr * k.wd) - k.lr * update;
  }
}

}  // namespace dtrain::ref
