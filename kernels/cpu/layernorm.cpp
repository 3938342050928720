// CPU layer normalisation over the last dim, f32 maths on f32/f16/bf16 storage;
// gamma/beta and dgamma/dbeta are f32 whatever x's dtype.
//   mean = sum x / n, var = sum (x - mean)^2 / n (two passes), rstd = 1/sqrt(var + eps)
//   y = (x - mean) rstd gamma + beta
// Backward, with xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dgamma = sum_rows dy xhat,  dbeta = sum_rows dy
// dx runs rows in parallel; dgamma/dbeta give each column block to one task that walks
// the rows in order, so nothing depends on the thread count and no workspace is needed.
// Row sums run on 16-float vectors (GCC vector extensions) in a fixed order: one
// vector accumulator over the row, then its lanes; a row's ragged end is a
// zero-padded vector with the lanes past it masked off.
// CUDA tensors go to kernels/cuda/layernorm.cu (same formulas, also deterministic).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cpu/vec16.h"
#include "kernels/cuda_ops.h"
#include "kernels/layernorm.h"

namespace dtrain::kernels {

namespace {

using cpu_io::as_f32;
using cpu_io::kBlock;
using cpu_io::load;

int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 13) / cols); }

using vec::kV;
using vec::splat;
using vec::v16;
using vec::v16i;
using vec::vload;
using vec::vstore;
// p[0, n) with n < 16, zeros above.
inline v16 vload_part(const float* p, int64_t n) {
  float b[kV] = {};
  std::copy(p, p + n, b);
  return vload(b);
}
inline void vstore_part(float* p, v16 v, int64_t n) {
  float b[kV];
  vstore(b, v);
  std::copy(b, b + n, p);
}
inline float hsum(v16 v) {
  float s = 0.0f;
  for (int i = 0; i < kV; ++i) s += v[i];
  return s;
}
// Lanes below n on (-1), the rest off.
inline v16i lanes_below(int64_t n) {
  const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<int32_t>(n);
}

// fn(c0, m, f32 views of a, b, c at c0) over [0, n) in kBlock chunks: f32 spans
// (c always) are used in place, half ones converted into stack buffers.
template <typename T, typename Fn>
void chunks3(int64_t n, const T* a, const T* b, const float* c, Fn fn) {
  float ba[kBlock], bb[kBlock];
  for (int64_t c0 = 0; c0 < n; c0 += kBlock) {
    const int64_t m = std::min(kBlock, n - c0);
    fn(c0, m, as_f32(a + c0, ba, m), as_f32(b + c0, bb, m), c + c0);
  }
}
// Writes f32 results for [c0, c0 + m) of dst: in place for f32, else through buf.
template <typename T>
float* out_span(T* dst, int64_t c0, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return dst + c0;
  } else {
    return buf;
  }
}
template <typename T>
void finish_span(T* dst, int64_t c0, int64_t m, const float* buf) {
  if constexpr (!std::is_same_v<T, float>) cpu_io::store_n(buf, dst + c0, m);
}

template <typename T>
void forward_rows(const LayerNormArgs& a, const T* x, const float* gamma, const float* beta, T* y,
                  float* mean, float* rstd) {
  const int64_t n = a.cols;
  parallel_for(0, a.rows, rows_per_task(n), [&](int64_t lo, int64_t hi) {
    float bx[kBlock], res[kBlock];
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * n;
      v16 sv{};
      for (int64_t c0 = 0; c0 < n; c0 += kBlock) {
        const int64_t m = std::min(kBlock, n - c0);
        const float* xv = as_f32(xr + c0, bx, m);
        int64_t k = 0;
        for (; k + kV <= m; k += kV) sv += vload(xv + k);
        if (k < m) sv += vload_part(xv + k, m - k);
      }
      const float mu = hsum(sv) / static_cast<float>(n);
      v16 ssv{};  // second pass over (x - mean)^2: no cancellation
      for (int64_t c0 = 0; c0 < n; c0 += kBlock) {
        const int64_t m = std::min(kBlock, n - c0);
        const float* xv = as_f32(xr + c0, bx, m);
        int64_t k = 0;
        for (; k + kV <= m; k += kV) {
          const v16 d = vload(xv + k) - mu;
          ssv += d * d;
        }
        if (k < m) {
          const v16 d = lanes_below(m - k) ? vload_part(xv + k, m - k) - mu : v16{};
          ssv += d * d;
        }
      }
      const float rs = 1.0f / std::sqrt(hsum(ssv) / static_cast<float>(n) + a.eps);
      T* yr = y + r * n;
      for (int64_t c0 = 0; c0 < n; c0 += kBlock) {
        const int64_t m = std::min(kBlock, n - c0);
        const float* xv = as_f32(xr + c0, bx, m);
        const float* gv = gamma + c0;
        const float* bv = beta + c0;
        float* out = out_span(yr, c0, res);
        int64_t k = 0;
        for (; k + kV <= m; k += kV)
          vstore(out + k, (vload(xv + k) - mu) * rs * vload(gv + k) + vload(bv + k));
        if (k < m) {
          const int64_t t = m - k;
          vstore_part(
              out + k,
              (vload_part(xv + k, t) - mu) * rs * vload_part(gv + k, t) + vload_part(bv + k, t), t);
        }
        finish_span(yr, c0, m, res);
      }
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
}

template <typename T>
void dx_rows(const LayerNormArgs& a, const T* x, const T* dy, const float* gamma, const float* mean,
             const float* rstd, T* dx) {
  const int64_t n = a.cols;
  parallel_for(0, a.rows, rows_per_task(n), [&](int64_t lo, int64_t hi) {
    float res[kBlock];
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * n;
      const T* dr = dy + r * n;
      const float mu = mean[r], rs = rstd[r];
      v16 sgv{}, sgxv{};
      // Padded lanes have dy = 0, so they add nothing to either sum.
      chunks3(n, xr, dr, gamma,
              [&](int64_t, int64_t m, const float* xv, const float* dv, const float* gv) {
                int64_t k = 0;
                for (; k + kV <= m; k += kV) {
                  const v16 g = vload(dv + k) * vload(gv + k);
                  sgv += g;
                  sgxv += g * ((vload(xv + k) - mu) * rs);
                }
                if (k < m) {
                  const int64_t t = m - k;
                  const v16 g = vload_part(dv + k, t) * vload_part(gv + k, t);
                  sgv += g;
                  sgxv += g * ((vload_part(xv + k, t) - mu) * rs);
                }
              });
      const float mg = hsum(sgv) / static_cast<float>(n), mgx = hsum(sgxv) / static_cast<float>(n);
      T* out_r = dx + r * n;
      chunks3(n, xr, dr, gamma,
              [&](int64_t c0, int64_t m, const float* xv, const float* dv, const float* gv) {
                float* out = out_span(out_r, c0, res);
                auto dx_of = [&](v16 xx, v16 dd, v16 gg) {
                  const v16 xhat = (xx - mu) * rs;
                  return rs * (dd * gg - mg - xhat * mgx);
                };
                int64_t k = 0;
                for (; k + kV <= m; k += kV)
                  vstore(out + k, dx_of(vload(xv + k), vload(dv + k), vload(gv + k)));
                if (k < m) {
                  const int64_t t = m - k;
                  vstore_part(
                      out + k,
                      dx_of(vload_part(xv + k, t), vload_part(dv + k, t), vload_part(gv + k, t)),
                      t);
                }
                finish_span(out_r, c0, m, res);
              });
    }
  });
}

// src[0, m) as full f32 floats: src itself when it is f32 and m == full, else
// converted into buf (whose lanes from m on stay as they were: zero).
template <typename T>
const float* padded_f32(const T* src, int64_t m, int64_t full, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (m == full) return src;
  }
  cpu_io::load_n(src, buf, m);
  return buf;
}

// dgamma, dbeta for columns [c0, c0 + NV * 16) (m of them, the rest padding),
// the rows in order, accumulators in registers.
template <int NV, typename T>
void param_block(const LayerNormArgs& a, const T* x, const T* dy, const float* mean,
                 const float* rstd, int64_t c0, int64_t m, float* dgamma, float* dbeta) {
  v16 ag[NV] = {}, ab[NV] = {};
  float bx[NV * kV] = {}, bd[NV * kV] = {};
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* xv = padded_f32(x + r * a.cols + c0, m, NV * kV, bx);
    const float* dv = padded_f32(dy + r * a.cols + c0, m, NV * kV, bd);  // dy = 0 adds nothing
    const float mu = mean[r], rs = rstd[r];
    for (int v = 0; v < NV; ++v) {
      const v16 d = vload(dv + v * kV);
      ag[v] += d * ((vload(xv + v * kV) - mu) * rs);
      ab[v] += d;
    }
  }
  float g[NV * kV], b[NV * kV];
  for (int v = 0; v < NV; ++v) {
    vstore(g + v * kV, ag[v]);
    vstore(b + v * kV, ab[v]);
  }
  std::copy(g, g + m, dgamma + c0);  // f32 sums, stored as they are
  std::copy(b, b + m, dbeta + c0);
}

// Column blocks of 64: enough tasks to spread over the threads at BERT's 768
// columns (three blocks of kBlock left one thread idle a third of the time).
template <typename T>
void param_grads(const LayerNormArgs& a, const T* x, const T* dy, const float* mean,
                 const float* rstd, float* dgamma, float* dbeta) {
  constexpr int kNV = 4;
  constexpr int64_t kCols = kNV * kV;
  const int64_t blocks = (a.cols + kCols - 1) / kCols;
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t c0 = b * kCols, m = std::min(kCols, a.cols - c0);
      param_block<kNV>(a, x, dy, mean, rstd, c0, m, dgamma, dbeta);
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
    require_dtype(op, "gamma/beta or their gradient", *t, {DType::f32});
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
    forward_rows(args, static_cast<const T*>(x.raw()), gamma.data<float>(), beta.data<float>(),
                 static_cast<T*>(y.raw()), save_mean.data<float>(), save_rstd.data<float>());
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
    dx_rows(args, xp, dyp, gamma.data<float>(), mean, rstd, static_cast<T*>(dx.raw()));
    param_grads(args, xp, dyp, mean, rstd, dgamma.data<float>(), dbeta.data<float>());
  });
}

}  // namespace dtrain::kernels
