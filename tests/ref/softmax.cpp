// Textbook fp64 softmax and cross-entropy. With label smoothing eps the target
// distribution is q = (1 - eps) onehot(t) + eps / C and the row loss is
// -sum_j q_j log softmax(x)_j (PyTorch's definition).
#include "ref/softmax.h"

#include <algorithm>
#include <cmath>

namespace dtrain::ref {

namespace {

double log_sum_exp(const double* x, int64_t n) {
  const double m = *std::max_element(x, x + n);
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}

double target_prob(const CrossEntropy& a, int64_t t, int64_t j) {
  return (j == t ? 1.0 - a.label_smoothing : 0.0) + a.label_smoothing / a.classes;
}

int64_t counted_rows(const CrossEntropy& a, const double* targets) {
  int64_t n = 0;
  for (int64_t r = 0; r < a.rows; ++r) n += static_cast<int64_t>(targets[r]) != a.ignore_index;
  return n;
}

}  // namespace

void softmax(int64_t rows, int64_t cols, const double* x, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const double lse = log_sum_exp(x + r * cols, cols);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = std::exp(x[r * cols + j] - lse);
  }
}

void softmax_backward(int64_t rows, int64_t cols, const double* y, const double* dy, double* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j) dot += dy[r * cols + j] * y[r * cols + j];
    for (int64_t j = 0; j < cols; ++j)
      dx[r * cols + j] = y[r * cols + j] * (dy[r * cols + j] - dot);
  }
}

void cross_entropy(const CrossEntropy& a, const double* logits, const double* targets, double* loss,
                   double* lse) {
  double total = 0.0;
  for (int64_t r = 0; r < a.rows; ++r) {
    const double* x = logits + r * a.classes;
    lse[r] = log_sum_exp(x, a.classes);
    const auto t = static_cast<int64_t>(targets[r]);
    if (t == a.ignore_index) continue;
    for (int64_t j = 0; j < a.classes; ++j) {  // 0 log 0 = 0: a masked (-inf) class adds nothing
      const double q = target_prob(a, t, j);
      if (q != 0.0) total -= q * (x[j] - lse[r]);
    }
  }
  const int64_t n = counted_rows(a, targets);
  loss[0] = n == 0 ? 0.0 : total / static_cast<double>(n);
}

void cross_entropy_backward(const CrossEntropy& a, const double* logits, const double* targets,
                            double dloss, double* dlogits) {
  const int64_t n = counted_rows(a, targets);
  for (int64_t r = 0; r < a.rows; ++r) {
    const double* x = logits + r * a.classes;
    const auto t = static_cast<int64_t>(targets[r]);
    const double lse = log_sum_exp(x, a.classes);
    for (int64_t j = 0; j < a.classes; ++j) {
      const double g =
          (std::exp(x[j] - lse) - target_prob(a, t, j)) * dloss / static_cast<double>(n);
      dlogits[r * a.classes + j] = t == a.ignore_index ? 0.0 : g;
    }
  }
}

}  // namespace dtrain::ref
