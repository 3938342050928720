// Textbook fp64 layer norm: mean and (biased) variance per row, then
//   y = (x - mean) / sqrt(var + eps) * gamma + beta.
// Backward: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
#include "ref/layernorm.h"

#include <cmath>
#include <vector>

namespace dtrain::ref {

namespace {

void row_stats(int64_t cols, double eps, const double* x, double& mean, double& rstd) {
  mean = sum(x, cols) / static_cast<double>(cols);
  double var = 0.0;
  for (int64_t j = 0; j < cols; ++j) var += (x[j] - mean) * (x[j] - mean);
  var /= static_cast<double>(cols);
  rstd = 1.0 / std::sqrt(var + eps);
}

}  // namespace

void layer_norm(int64_t rows, int64_t cols, double eps, const double* x, const double* gamma,
                const double* beta, double* y, double* mean, double* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    row_stats(cols, eps, x + r * cols, mean[r], rstd[r]);
    for (int64_t j = 0; j < cols; ++j) {
      y[r * cols + j] = (x[r * cols + j] - mean[r]) * rstd[r] * gamma[j] + beta[j];
    }
  }
}

void layer_norm_backward(int64_t rows, int64_t cols, double eps, const double* x,
                         const double* gamma, const double* dy, double* dx, double* dgamma,
                         double* dbeta) {
  for (int64_t j = 0; j < cols; ++j) dgamma[j] = dbeta[j] = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, rstd = 0.0;
    row_stats(cols, eps, x + r * cols, mean, rstd);
    std::vector<double> xhat(cols), g(cols);
    for (int64_t j = 0; j < cols; ++j) {
      xhat[j] = (x[r * cols + j] - mean) * rstd;
      g[j] = dy[r * cols + j] * gamma[j];
      dgamma[j] += dy[r * cols + j] * xhat[j];
      dbeta[j] += dy[r * cols + j];
    }
    double mg = 0.0, mgx = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      mg += g[j] / static_cast<double>(cols);
      mgx += g[j] * xhat[j] / static_cast<double>(cols);
    }
    for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = rstd * (g[j] - mg - xhat[j] * mgx);
  }
}

}  // namespace dtrain::ref
