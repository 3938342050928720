// fp64 reference batch norm. With M = N*HW elements per channel:
//   mean = sum x / M, var = sum (x - mean)^2 / M (biased, used to normalise),
//   running_var <- (1-m) running_var + m * var * M / (M - 1) (unbiased),
//   dx = gamma * invstd / M * (M dy - sum dy - xhat * sum(dy xhat)).
#include "ref/batchnorm.h"

#include <cmath>

namespace dtrain::ref {
namespace {

double& at(const kernels::BatchNormArgs& a, double* t, int64_t n, int64_t c, int64_t i) {
  return t[(n * a.c + c) * a.hw + i];
}
double at(const kernels::BatchNormArgs& a, const double* t, int64_t n, int64_t c, int64_t i) {
  return t[(n * a.c + c) * a.hw + i];
}

}  // namespace

void batch_norm_forward_train(const kernels::BatchNormArgs& a, const double* x, const double* gamma,
                              const double* beta, double* y, double* running_mean,
                              double* running_var, double* save_mean, double* save_invstd) {
  const double m = static_cast<double>(a.n * a.hw);
  for (int64_t c = 0; c < a.c; ++c) {
    double sum = 0.0;
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t i = 0; i < a.hw; ++i) sum += at(a, x, n, c, i);
    const double mean = sum / m;
    double sq = 0.0;
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t i = 0; i < a.hw; ++i)
        sq += (at(a, x, n, c, i) - mean) * (at(a, x, n, c, i) - mean);
    const double var = sq / m;
    const double invstd = 1.0 / std::sqrt(var + a.eps);
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t i = 0; i < a.hw; ++i)
        at(a, y, n, c, i) = (at(a, x, n, c, i) - mean) * invstd * gamma[c] + beta[c];
    const double unbiased = m > 1 ? var * m / (m - 1) : var;
    running_mean[c] = (1 - a.momentum) * running_mean[c] + a.momentum * mean;
    running_var[c] = (1 - a.momentum) * running_var[c] + a.momentum * unbiased;
    save_mean[c] = mean;
    save_invstd[c] = invstd;
  }
}

void batch_norm_forward_infer(const kernels::BatchNormArgs& a, const double* x, const double* gamma,
                              const double* beta, const double* running_mean,
                              const double* running_var, double* y) {
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t c = 0; c < a.c; ++c) {
      const double invstd = 1.0 / std::sqrt(running_var[c] + a.eps);
      for (int64_t i = 0; i < a.hw; ++i)
        at(a, y, n, c, i) = (at(a, x, n, c, i) - running_mean[c]) * invstd * gamma[c] + beta[c];
    }
}

void batch_norm_backward(const kernels::BatchNormArgs& a, const double* x, const double* dy,
                         const double* gamma, const double* save_mean, const double* save_invstd,
                         double* dx, double* dgamma, double* dbeta) {
  const double m = static_cast<double>(a.n * a.hw);
  for (int64_t c = 0; c < a.c; ++c) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t i = 0; i < a.hw; ++i) {
        const double xhat = (at(a, x, n, c, i) - save_mean[c]) * save_invstd[c];
        sum_dy += at(a, dy, n, c, i);
        sum_dy_xhat += at(a, dy, n, c, i) * xhat;
      }
    dbeta[c] = sum_dy;
    dgamma[c] = sum_dy_xhat;
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t i = 0; i < a.hw; ++i) {
        const double xhat = (at(a, x, n, c, i) - save_mean[c]) * save_invstd[c];
        at(a, dx, n, c, i) =
            gamma[c] * save_invstd[c] / m * (m * at(a, dy, n, c, i) - sum_dy - xhat * sum_dy_xhat);
      }
  }
}

}  // namespace dtrain::ref
