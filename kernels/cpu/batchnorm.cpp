// CPU batch normalisation over x [N, C, HW]: one thread per channel, so every
// per-channel sum runs in a fixed order (bit-identical for any thread count).
// Sums take float partials over 512-element chunks (SIMD), added in double.
// Half x/y/dy/dx are widened chunk by chunk into stack buffers; no workspace.
#include "kernels/batchnorm.h"

#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {
namespace {

constexpr int64_t kChunk = 512;

// Calls fn(const float* chunk, len, offset) over row[0:n] as f32 chunks.
template <typename T, typename Fn>
void for_chunks(const T* row, int64_t n, Fn&& fn) {
  float buf[kChunk];
  for (int64_t o = 0; o < n; o += kChunk) {
    const int64_t len = std::min(kChunk, n - o);
    if constexpr (std::is_same_v<T, float>) {
      fn(row + o, len, o);
    } else {
      cpu_io::load_n(row + o, buf, len);
      fn(static_cast<const float*>(buf), len, o);
    }
  }
}

float chunk_sum(const float* x, int64_t len) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < len; ++i) s += x[i];
  return s;
}

// y[0:n] = x * scale + shift, through f32 chunks.
template <typename T>
void affine_row(const T* x, T* y, int64_t n, float scale, float shift) {
  if constexpr (std::is_same_v<T, float>) {  // straight through: no staging
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale + shift;
    return;
  }
  for_chunks(x, n, [&](const float* xc, int64_t len, int64_t o) {
    float out[kChunk];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) out[i] = xc[i] * scale + shift;
    cpu_io::store_n(out, y + o, len);
  });
}

struct Moments {
  double mean, var;  // biased variance
};

template <typename T>
Moments channel_moments(const BatchNormArgs& a, const T* x, int64_t c) {
  double sum = 0.0;
  for (int64_t n = 0; n < a.n; ++n) {
    for_chunks(x + (n * a.c + c) * a.hw, a.hw,
               [&](const float* xc, int64_t len, int64_t) { sum += chunk_sum(xc, len); });
  }
  const double m = static_cast<double>(a.n * a.hw);
  const float mean = static_cast<float>(sum / m);
  double sq = 0.0;
  for (int64_t n = 0; n < a.n; ++n) {
    for_chunks(x + (n * a.c + c) * a.hw, a.hw, [&](const float* xc, int64_t len, int64_t) {
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < len; ++i) s += (xc[i] - mean) * (xc[i] - mean);
      sq += s;
    });
  }
  return {sum / m, sq / m};
}

template <typename T>
void forward_train(const BatchNormArgs& a, const T* x, const float* gamma, const float* beta, T* y,
                   float* run_mean, float* run_var, float* save_mean, float* save_invstd) {
  const double m = static_cast<double>(a.n * a.hw);
  parallel_for(0, a.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Moments mo = channel_moments(a, x, c);
      const double invstd = 1.0 / std::sqrt(mo.var + a.eps);
      const float scale = static_cast<float>(gamma[c] * invstd);
      const float shift = static_cast<float>(beta[c] - mo.mean * gamma[c] * invstd);
      for (int64_t n = 0; n < a.n; ++n) {
        const int64_t row = (n * a.c + c) * a.hw;
        affine_row(x + row, y + row, a.hw, scale, shift);
      }
      const double unbiased = m > 1 ? mo.var * m / (m - 1) : mo.var;
      run_mean[c] = static_cast<float>((1.0 - a.momentum) * run_mean[c] + a.momentum * mo.mean);
      run_var[c] = static_cast<float>((1.0 - a.momentum) * run_var[c] + a.momentum * unbiased);
      save_mean[c] = static_cast<float>(mo.mean);
      save_invstd[c] = static_cast<float>(invstd);
    }
  });
}

template <typename T>
void forward_infer(const BatchNormArgs& a, const T* x, const float* gamma, const float* beta,
                   const float* run_mean, const float* run_var, T* y) {
  parallel_for(0, a.n * a.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % a.c;
      const double invstd = 1.0 / std::sqrt(static_cast<double>(run_var[c]) + a.eps);
      const float scale = static_cast<float>(gamma[c] * invstd);
      const float shift = static_cast<float>(beta[c] - run_mean[c] * gamma[c] * invstd);
      affine_row(x + r * a.hw, y + r * a.hw, a.hw, scale, shift);
    }
  });
}

// dx = gamma * invstd * (dy - sum(dy)/M - xhat * sum(dy * xhat)/M), xhat = (x - mean) * invstd
template <typename T>
void backward(const BatchNormArgs& a, const T* x, const T* dy, const float* gamma,
              const float* mean, const float* invstd, T* dx, float* dgamma, float* dbeta) {
  const double m = static_cast<double>(a.n * a.hw);
  parallel_for(0, a.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float mu = mean[c], is = invstd[c];
      double sum_dy = 0.0, sum_dy_xhat = 0.0;
      for (int64_t n = 0; n < a.n; ++n) {
        const int64_t row = (n * a.c + c) * a.hw;
        for_chunks(dy + row, a.hw, [&](const float* g, int64_t len, int64_t o) {
          float staged[kChunk];
          const float* xc = staged;
          if constexpr (std::is_same_v<T, float>) {
            xc = x + row + o;
          } else {
            cpu_io::load_n(x + row + o, staged, len);
          }
          float s0 = 0.0f, s1 = 0.0f;
#pragma omp simd reduction(+ : s0, s1)
          for (int64_t i = 0; i < len; ++i) {
            s0 += g[i];
            s1 += g[i] * (xc[i] - mu) * is;
          }
          sum_dy += s0;
          sum_dy_xhat += s1;
        });
      }
      dbeta[c] = static_cast<float>(sum_dy);
      dgamma[c] = static_cast<float>(sum_dy_xhat);
      const float k = gamma[c] * is, mean_dy = static_cast<float>(sum_dy / m);
      const float mean_dy_xhat = static_cast<float>(sum_dy_xhat / m);
      for (int64_t n = 0; n < a.n; ++n) {
        const int64_t row = (n * a.c + c) * a.hw;
        if constexpr (std::is_same_v<T, float>) {  // straight through: no staging
          const float* g = dy + row;
          const float* xc = x + row;
          float* out = dx + row;
#pragma omp simd
          for (int64_t i = 0; i < a.hw; ++i) {
            out[i] = k * (g[i] - mean_dy - (xc[i] - mu) * is * mean_dy_xhat);
          }
          continue;
        }
        for_chunks(dy + row, a.hw, [&](const float* g, int64_t len, int64_t o) {
          float xc[kChunk], out[kChunk];
          cpu_io::load_n(x + row + o, xc, len);
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) {
            out[i] = k * (g[i] - mean_dy - (xc[i] - mu) * is * mean_dy_xhat);
          }
          cpu_io::store_n(out, dx + row + o, len);
        });
      }
    }
  });
}

void check_common(std::string_view op, const BatchNormArgs& a, const Tensor& x, const Tensor& y,
                  std::initializer_list<const Tensor*> per_channel) {
  DTRAIN_CHECK(a.n > 0 && a.c > 0 && a.hw > 0, "{}: empty shape n {} c {} hw {}", op, a.n, a.c,
               a.hw);
  require_dtype(op, "x", x, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "y", y, {x.dtype()});
  require_numel(op, "x", x, a.n * a.c * a.hw);
  require_numel(op, "y", y, a.n * a.c * a.hw);
  for (const Tensor* t : per_channel) {
    require_dtype(op, "per-channel tensor", *t, {DType::f32});
    require_numel(op, "per-channel tensor", *t, a.c);
  }
}

}  // namespace

void batch_norm_forward_train(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, Tensor& y, Tensor& running_mean,
                              Tensor& running_var, Tensor& save_mean, Tensor& save_invstd) {
  constexpr std::string_view op = "batch_norm_forward_train";
  const Device device = same_device(
      op, {&x, &gamma, &beta, &y, &running_mean, &running_var, &save_mean, &save_invstd});
  check_common(op, args, x, y,
               {&gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd});
  if (device.is_cuda()) {
    return cuda_ops::batch_norm_forward_train(args, x, gamma, beta, y, running_mean, running_var,
                                              save_mean, save_invstd);
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_train(args, x.data<T>(), gamma.data<float>(), beta.data<float>(), y.data<T>(),
                  running_mean.data<float>(), running_var.data<float>(), save_mean.data<float>(),
                  save_invstd.data<float>());
  });
}

void batch_norm_forward_infer(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, const Tensor& running_mean,
                              const Tensor& running_var, Tensor& y) {
  constexpr std::string_view op = "batch_norm_forward_infer";
  const Device device = same_device(op, {&x, &gamma, &beta, &running_mean, &running_var, &y});
  check_common(op, args, x, y, {&gamma, &beta, &running_mean, &running_var});
  if (device.is_cuda()) {
    return cuda_ops::batch_norm_forward_infer(args, x, gamma, beta, running_mean, running_var, y);
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_infer(args, x.data<T>(), gamma.data<float>(), beta.data<float>(),
                  running_mean.data<float>(), running_var.data<float>(), y.data<T>());
  });
}

void batch_norm_backward(const BatchNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  constexpr std::string_view op = "batch_norm_backward";
  const Device device =
      same_device(op, {&x, &dy, &gamma, &save_mean, &save_invstd, &dx, &dgamma, &dbeta});
  check_common(op, args, x, dx, {&gamma, &save_mean, &save_invstd, &dgamma, &dbeta});
  require_dtype(op, "dy", dy, {x.dtype()});
  require_numel(op, "dy", dy, args.n * args.c * args.hw);
  if (device.is_cuda()) {
    return cuda_ops::batch_norm_backward(args, x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                                         dbeta);
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    backward(args, x.data<T>(), dy.data<T>(), gamma.data<float>(), save_mean.data<float>(),
             save_invstd.data<float>(), dx.data<T>(), dgamma.data<float>(), dbeta.data<float>());
  });
}

}  // namespace dtrain::kernels
