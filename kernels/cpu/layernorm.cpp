// CPU layer normalisation over the last dim, f32 maths on f32/f16/bf16 storage.
//   mean = sum x / n, var = sum (x - mean)^2 / n (two passes), rstd = 1/sqrt(var + eps)
//   y = (x - mean) rstd gamma + beta
// Backward, with xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dgamma = sum_rows dy xhat,  dbeta = sum_rows dy
// dx runs rows in parallel; dgamma/dbeta give each column block to one task that walks
// the rows in order, so nothing depends on the thread count and no workspace is needed.
// CUDA tensors go to kernels/cuda/layernorm.cu (same formulas, also deterministic).
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/layernorm.h"

namespace dtrain::kernels {

namespace {

using cpu_io::as_f32;
using cpu_io::kBlock;
using cpu_io::load;

int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 13) / cols); }

template <typename T>
void forward_rows(const LayerNormArgs& a, const T* x, const T* gamma, const T* beta, T* y,
                  float* mean, float* rstd) {
  const int64_t n = a.cols;
  parallel_for(0, a.rows, rows_per_task(n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * n;
      float s = 0.0f;
      for (int64_t j = 0; j < n; ++j) s += load(xr, j);
      const float m = s / static_cast<float>(n);
      float ss = 0.0f;
      for (int64_t j = 0; j < n; ++j) ss += (load(xr, j) - m) * (load(xr, j) - m);
      const float rs = 1.0f / std::sqrt(ss / static_cast<float>(n) + a.eps);
      for (int64_t j = 0; j < n; ++j) {
        cpu_io::store(y + r * n, j, (load(xr, j) - m) * rs * load(gamma, j) + load(beta, j));
      }
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

template <typename T>
void dx_rows(const LayerNormArgs& a, const T* x, const T* dy, const T* gamma, const float* mean,
             const float* rstd, T* dx) {
  const int64_t n = a.cols;
  parallel_for(0, a.rows, rows_per_task(n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * n;
      const T* dr = dy + r * n;
      float sg = 0.0f, sgx = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float g = load(dr, j) * load(gamma, j);
        sg += g;
        sgx += g * (load(xr, j) - mean[r]) * rstd[r];
      }
      const float mg = sg / static_cast<float>(n), mgx = sgx / static_cast<float>(n);
      for (int64_t j = 0; j < n; ++j) {
        const float xhat = (load(xr, j) - mean[r]) * rstd[r];
        const float g = load(dr, j) * load(gamma, j);
        cpu_io::store(dx + r * n, j, rstd[r] * (g - mg - xhat * mgx));
      }
    }
  });
}

template <typename T>
void param_grads(const LayerNormArgs& a, const T* x, const T* dy, const float* mean,
                 const float* rstd, T* dgamma, T* dbeta) {
  const int64_t blocks = (a.cols + kBlock - 1) / kBlock;
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    float ag[kBlock], ab[kBlock], bx[kBlock], bd[kBlock];
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t c0 = b * kBlock, m = std::min(kBlock, a.cols - c0);
      std::fill_n(ag, m, 0.0f);
      std::fill_n(ab, m, 0.0f);
      for (int64_t r = 0; r < a.rows; ++r) {
        const float* xv = as_f32(x + r * a.cols + c0, bx, m);
        const float* dv = as_f32(dy + r * a.cols + c0, bd, m);
        for (int64_t k = 0; k < m; ++k) {
          ag[k] += dv[k] * ((xv[k] - mean[r]) * rstd[r]);
          ab[k] += dv[k];
        }
      }
      cpu_io::store_n(ag, dgamma + c0, m);
      cpu_io::store_n(ab, dbeta + c0, m);
    }
  });
}

void check_args(std::string_view op, const LayerNormArgs& a, const Tensor& x,
                std::initializer_list<const Tensor*> rows_cols,
                std::initializer_list<const Tensor*> cols,
                std::initializer_list<const Tensor*> stats) {
  require_dtype(op, "x", x, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(a.rows >= 0 && a.cols >= 1, "{}: {} rows, {} cols", op, a.rows, a.cols);
  for (const Tensor* t : rows_cols) {
    DTRAIN_CHECK(t->dtype() == x.dtype(), "{}: {} is not {}", op, t->str(), dtype_name(x.dtype()));
    require_numel(op, "[rows, cols] tensor", *t, a.rows * a.cols);
  }
  for (const Tensor* t : cols) {
    DTRAIN_CHECK(t->dtype() == x.dtype(), "{}: {} is not {}", op, t->str(), dtype_name(x.dtype()));
    require_numel(op, "[cols] tensor", *t, a.cols);
  }
  for (const Tensor* t : stats) {
    require_dtype(op, "saved statistic", *t, {DType::f32});
    require_numel(op, "saved statistic", *t, a.rows);
  }
}

}  // namespace

void layer_norm_forward(const LayerNormArgs& args, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, Tensor& y, Tensor& save_mean, Tensor& save_rstd) {
  const Device device =
      same_device("layer_norm_forward", {&x, &gamma, &beta, &y, &save_mean, &save_rstd});
  check_args("layer_norm_forward", args, x, {&x, &y}, {&gamma, &beta}, {&save_mean, &save_rstd});
  if (device.is_cuda()) {
    return cuda_ops::layer_norm_forward(args, x, gamma, beta, y, save_mean, save_rstd);
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_rows(args, static_cast<const T*>(x.raw()), static_cast<const T*>(gamma.raw()),
                 static_cast<const T*>(beta.raw()), static_cast<T*>(y.raw()),
                 save_mean.data<float>(), save_rstd.data<float>());
  });
}

void layer_norm_backward(const LayerNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const Device device = same_device(
      "layer_norm_backward", {&x, &dy, &gamma, &save_mean, &save_rstd, &dx, &dgamma, &dbeta});
  check_args("layer_norm_backward", args, x, {&x, &dy, &dx}, {&gamma, &dgamma, &dbeta},
             {&save_mean, &save_rstd});
  if (device.is_cuda()) {
    return cuda_ops::layer_norm_backward(args, x, dy, gamma, save_mean, save_rstd, dx, dgamma,
                                         dbeta);
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
    const T* dyp = static_cast<const T*>(dy.raw());
    const float* mean = save_mean.data<float>();
    const float* rstd = save_rstd.data<float>();
    dx_rows(args, xp, dyp, static_cast<const T*>(gamma.raw()), mean, rstd,
            static_cast<T*>(dx.raw()));
    param_grads(args, xp, dyp, mean, rstd, static_cast<T*>(dgamma.raw()),
                static_cast<T*>(dbeta.raw()));
  });
}

}  // namespace dtrain::kernels
