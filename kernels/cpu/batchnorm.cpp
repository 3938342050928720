// CPU batch normalisation over x [N, C, HW], or the same channel-blocked
// ([N, C/B, HW, B], BatchNormArgs::block). Every per-channel sum has one order,
// whatever the layout and thread count: over images, then 512-element chunks of the
// channel's plane, each chunk's float sum taken in eight running lane sums (element i
// into lane i % 8, then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))) and added
// in double. A plain layout runs one channel per task, the lanes in one vector; a
// blocked one eight channels per task, a vector per lane. Every product and sum is
// rounded as written (no multiply-add contraction: kernels/CMakeLists.txt), so both
// layouts give the same bits. Half x/y/dy/dx are widened chunk by chunk into stack
// buffers (plain) or eight channels at a time (blocked: f32 and bf16), and rounded once
// on store; no workspace.
#include "kernels/batchnorm.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {
namespace {

constexpr int64_t kChunk = 512;

using v8 = cpu_io::v8f;
using v8i = int32_t __attribute__((vector_size(32)));
using cpu_io::load8;
using cpu_io::store8;

float combine(v8 l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }
v8 combine(const v8* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// The lane sum of f(x[i]) over one plain chunk (len <= kChunk), f element-wise on v8.
template <typename F>
float lane_sum(const float* x, int64_t len, F&& f) {
  v8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) acc += f(load8(x + i));
  if (i < len) {
    float t[8] = {};
    std::memcpy(t, x + i, static_cast<size_t>(len - i) * sizeof(float));
    const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    acc = lane < static_cast<int32_t>(len - i) ? acc + f(load8(t)) : acc;
  }
  return combine(acc);
}

// The same for eight channels at once: x at position i is x[i * stride], 8 channels.
template <typename T, typename F>
v8 lane_sum8(const T* x, int64_t stride, int64_t len, F&& f) {
  v8 acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += f(load8(x + (i + j) * stride), i + j);
  }
  for (int j = 0; i + j < len; ++j) acc[j] += f(load8(x + (i + j) * stride), i + j);
  return combine(acc);
}

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

// The ReLU fused (f32, bf16): the ReLU op's (r < 0 ? 0 : r) of what batch norm alone would
// store, r: for bf16 the rounded value (a tiny negative t rounds to -0, which the ReLU
// keeps), so the fused op gives batch norm then ReLU's bits.
template <typename T>
float relu_of(float t) {
  if constexpr (std::is_same_v<T, bf16>) t = cpu_io::bf16_to_float(cpu_io::float_to_bf16(t));
  return t < 0.0f ? 0.0f : t;
}
// Stores relu_of(t), eight lanes: bf16 on the rounded bits (a negative number, not a NaN
// nor -0, becomes +0).
template <typename T>
void store8_relu(T* p, v8 t) {
  if constexpr (std::is_same_v<T, bf16>) {
    using v8h = cpu_io::v8h;
    v8h h = cpu_io::round8_bf16(t);
    const v8h mag = h & 0x7fffu;
    h = (h & 0x8000u) != 0 && mag != 0 && mag <= 0x7f80u ? v8h{} : h;
    std::memcpy(p, &h, sizeof h);
  } else {
    store8(p, t < 0.0f ? v8{} : t);
  }
}

// y[0:n] = x * scale + shift, through f32 chunks; relu: relu_of.
template <typename T>
void affine_row(const T* x, T* y, int64_t n, float scale, float shift, bool relu) {
  if constexpr (std::is_same_v<T, float>) {  // straight through: no staging
    if (relu) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float t = x[i] * scale + shift;
        y[i] = t < 0.0f ? 0.0f : t;
      }
      return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale + shift;
    return;
  }
  for_chunks(x, n, [&](const float* xc, int64_t len, int64_t o) {
    float out[kChunk];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) out[i] = xc[i] * scale + shift;
    if (relu) {
      for (int64_t i = 0; i < len; ++i) out[i] = relu_of<T>(out[i]);
    }
    cpu_io::store_n(out, y + o, len);
  });
}

// One channel's statistics from its sums, and what forward does with them.
struct ChannelStats {
  float scale, shift;  // y = x * scale + shift
  double mean, invstd, var;
};

ChannelStats channel_stats(const BatchNormArgs& a, double mean, double var, float gamma,
                           float beta) {
  const double invstd = 1.0 / std::sqrt(var + a.eps);
  return {static_cast<float>(gamma * invstd), static_cast<float>(beta - mean * gamma * invstd),
          mean, invstd, var};
}

void update_channel(const BatchNormArgs& a, const ChannelStats& st, float& run_mean, float& run_var,
                    float& save_mean, float& save_invstd) {
  const double m = static_cast<double>(a.n * a.hw);
  const double unbiased = m > 1 ? st.var * m / (m - 1) : st.var;
  run_mean = static_cast<float>((1.0 - a.momentum) * run_mean + a.momentum * st.mean);
  run_var = static_cast<float>((1.0 - a.momentum) * run_var + a.momentum * unbiased);
  save_mean = static_cast<float>(st.mean);
  save_invstd = static_cast<float>(st.invstd);
}

struct Moments {
  double mean, var;  // biased variance
};

template <typename T>
Moments channel_moments(const BatchNormArgs& a, const T* x, int64_t c) {
  double sum = 0.0;
  for (int64_t n = 0; n < a.n; ++n) {
    for_chunks(x + (n * a.c + c) * a.hw, a.hw, [&](const float* xc, int64_t len, int64_t) {
      sum += lane_sum(xc, len, [](v8 v) { return v; });
    });
  }
  const double m = static_cast<double>(a.n * a.hw);
  const float mean = static_cast<float>(sum / m);
  double sq = 0.0;
  for (int64_t n = 0; n < a.n; ++n) {
    for_chunks(x + (n * a.c + c) * a.hw, a.hw, [&](const float* xc, int64_t len, int64_t) {
      sq += lane_sum(xc, len, [&](v8 v) {
        const v8 d = v - mean;
        return d * d;
      });
    });
  }
  return {sum / m, sq / m};
}

// Blocked: the eight channels [c0, c0 + 8) of block c0 / B; x of image n, position i at
// x[((n * C/B + c0 / B) * hw + i) * B + c0 % B].
struct Group {
  int64_t c0, block, blocks;  // first channel, B, C / B
  template <typename T>
  T* at(T* x, const BatchNormArgs& a, int64_t n) const {
    return x + ((n * blocks + c0 / block) * a.hw) * block + c0 % block;
  }
};

template <typename T>
void group_moments(const BatchNormArgs& a, const Group& g, const T* x, double* mean, double* var) {
  double sum[8] = {};
  for (int64_t n = 0; n < a.n; ++n) {
    const T* xn = g.at(x, a, n);
    for (int64_t o = 0; o < a.hw; o += kChunk) {
      const v8 s = lane_sum8(xn + o * g.block, g.block, std::min(kChunk, a.hw - o),
                             [](v8 v, int64_t) { return v; });
      for (int l = 0; l < 8; ++l) sum[l] += s[l];
    }
  }
  const double m = static_cast<double>(a.n * a.hw);
  v8 mean_f;
  for (int l = 0; l < 8; ++l) mean_f[l] = static_cast<float>(sum[l] / m);
  double sq[8] = {};
  for (int64_t n = 0; n < a.n; ++n) {
    const T* xn = g.at(x, a, n);
    for (int64_t o = 0; o < a.hw; o += kChunk) {
      const v8 s =
          lane_sum8(xn + o * g.block, g.block, std::min(kChunk, a.hw - o), [&](v8 v, int64_t) {
            const v8 d = v - mean_f;
            return d * d;
          });
      for (int l = 0; l < 8; ++l) sq[l] += s[l];
    }
  }
  for (int l = 0; l < 8; ++l) {
    mean[l] = sum[l] / m;
    var[l] = sq[l] / m;
  }
}

// y = x * scale + shift over a group's eight channels.
template <typename T>
void group_affine(const BatchNormArgs& a, const Group& g, const T* x, T* y, v8 scale, v8 shift) {
  for (int64_t n = 0; n < a.n; ++n) {
    const T* xn = g.at(x, a, n);
    T* yn = g.at(y, a, n);
    for (int64_t i = 0; i < a.hw; ++i) {
      const v8 t = load8(xn + i * g.block) * scale + shift;
      if (a.relu) {
        store8_relu(yn + i * g.block, t);
      } else {
        store8(yn + i * g.block, t);
      }
    }
  }
}

template <typename T>
void forward_train(const BatchNormArgs& a, const T* x, const float* gamma, const float* beta, T* y,
                   float* run_mean, float* run_var, float* save_mean, float* save_invstd) {
  if (a.block > 0) {
    if constexpr (!std::is_same_v<T, f16>) {  // f32, bf16 (check_common)
      parallel_for(0, a.c / 8, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t gi = g0; gi < g1; ++gi) {
          const Group g{gi * 8, a.block, a.c / a.block};
          double mean[8], var[8];
          group_moments(a, g, x, mean, var);
          v8 scale = {}, shift = {};
          for (int l = 0; l < 8; ++l) {
            const int64_t c = g.c0 + l;
            const ChannelStats st = channel_stats(a, mean[l], var[l], gamma[c], beta[c]);
            scale[l] = st.scale;
            shift[l] = st.shift;
            update_channel(a, st, run_mean[c], run_var[c], save_mean[c], save_invstd[c]);
          }
          group_affine(a, g, x, y, scale, shift);
        }
      });
    }
    return;
  }
  parallel_for(0, a.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Moments mo = channel_moments(a, x, c);
      const ChannelStats st = channel_stats(a, mo.mean, mo.var, gamma[c], beta[c]);
      for (int64_t n = 0; n < a.n; ++n) {
        const int64_t row = (n * a.c + c) * a.hw;
        affine_row(x + row, y + row, a.hw, st.scale, st.shift, a.relu);
      }
      update_channel(a, st, run_mean[c], run_var[c], save_mean[c], save_invstd[c]);
    }
  });
}

ChannelStats infer_stats(const BatchNormArgs& a, int64_t c, const float* gamma, const float* beta,
                         const float* run_mean, const float* run_var) {
  const double invstd = 1.0 / std::sqrt(static_cast<double>(run_var[c]) + a.eps);
  return {static_cast<float>(gamma[c] * invstd),
          static_cast<float>(beta[c] - run_mean[c] * gamma[c] * invstd), 0.0, invstd, 0.0};
}

template <typename T>
void forward_infer(const BatchNormArgs& a, const T* x, const float* gamma, const float* beta,
                   const float* run_mean, const float* run_var, T* y) {
  if (a.block > 0) {
    if constexpr (!std::is_same_v<T, f16>) {  // f32, bf16 (check_common)
      parallel_for(0, a.c / 8, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t gi = g0; gi < g1; ++gi) {
          const Group g{gi * 8, a.block, a.c / a.block};
          v8 scale = {}, shift = {};
          for (int l = 0; l < 8; ++l) {
            const ChannelStats st = infer_stats(a, g.c0 + l, gamma, beta, run_mean, run_var);
            scale[l] = st.scale;
            shift[l] = st.shift;
          }
          group_affine(a, g, x, y, scale, shift);
        }
      });
    }
    return;
  }
  parallel_for(0, a.n * a.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const ChannelStats st = infer_stats(a, r % a.c, gamma, beta, run_mean, run_var);
      affine_row(x + r * a.hw, y + r * a.hw, a.hw, st.scale, st.shift, a.relu);
    }
  });
}

// dx = gamma * invstd * (dy - sum(dy)/M - xhat * sum(dy * xhat)/M), xhat = (x - mean) * invstd,
// every element as (k * ((g - mean_dy) - (((x - mu) * is) * mean_dy_xhat))).
template <typename V, typename S>
V dx_of(V g, V x, S mu, S is, S k, S mean_dy, S mean_dy_xhat) {
  return k * ((g - mean_dy) - (((x - mu) * is) * mean_dy_xhat));
}

// relu_y (or null): dy counts where it is > 0 only (the ReLU's backward, fused).
template <typename T>
void group_backward(const BatchNormArgs& a, const Group& grp, const T* x, const T* dy,
                    const T* relu_y, const float* gamma, const float* mean, const float* invstd,
                    T* dx, float* dgamma, float* dbeta) {
  const auto masked = [](v8 g, const T* y) {
    if (!y) return g;
    return load8(y) > 0.0f ? g : v8{};
  };
  v8 mu, is;
  for (int l = 0; l < 8; ++l) {
    mu[l] = mean[grp.c0 + l];
    is[l] = invstd[grp.c0 + l];
  }
  double sum_dy[8] = {}, sum_dy_xhat[8] = {};
  for (int64_t n = 0; n < a.n; ++n) {
    const T* gn = grp.at(dy, a, n);
    const T* xn = grp.at(x, a, n);
    const T* yn = relu_y ? grp.at(relu_y, a, n) : nullptr;
    for (int64_t o = 0; o < a.hw; o += kChunk) {
      const int64_t len = std::min(kChunk, a.hw - o);
      const T* gc = gn + o * grp.block;
      const T* xc = xn + o * grp.block;
      const T* yc = yn ? yn + o * grp.block : nullptr;
      const auto y_at = [&](int64_t i) { return yc ? yc + i * grp.block : nullptr; };
      const v8 s0 =
          lane_sum8(gc, grp.block, len, [&](v8 v, int64_t i) { return masked(v, y_at(i)); });
      const v8 s1 = lane_sum8(gc, grp.block, len, [&](v8 v, int64_t i) {
        return (masked(v, y_at(i)) * (load8(xc + i * grp.block) - mu)) * is;
      });
      for (int l = 0; l < 8; ++l) {
        sum_dy[l] += s0[l];
        sum_dy_xhat[l] += s1[l];
      }
    }
  }
  const double m = static_cast<double>(a.n * a.hw);
  v8 k, mean_dy, mean_dy_xhat;
  for (int l = 0; l < 8; ++l) {
    const int64_t c = grp.c0 + l;
    dbeta[c] = static_cast<float>(sum_dy[l]);
    dgamma[c] = static_cast<float>(sum_dy_xhat[l]);
    k[l] = gamma[c] * is[l];
    mean_dy[l] = static_cast<float>(sum_dy[l] / m);
    mean_dy_xhat[l] = static_cast<float>(sum_dy_xhat[l] / m);
  }
  for (int64_t n = 0; n < a.n; ++n) {
    const T* gn = grp.at(dy, a, n);
    const T* xn = grp.at(x, a, n);
    const T* yn = relu_y ? grp.at(relu_y, a, n) : nullptr;
    T* dn = grp.at(dx, a, n);
    for (int64_t i = 0; i < a.hw; ++i) {
      const int64_t p = i * grp.block;
      const v8 g = masked(load8(gn + p), yn ? yn + p : nullptr);
      store8(dn + p, dx_of(g, load8(xn + p), mu, is, k, mean_dy, mean_dy_xhat));
    }
  }
}

template <typename T>
void backward(const BatchNormArgs& a, const T* x, const T* dy, const T* relu_y, const float* gamma,
              const float* mean, const float* invstd, T* dx, float* dgamma, float* dbeta) {
  if (a.block > 0) {
    if constexpr (!std::is_same_v<T, f16>) {  // f32, bf16 (check_common)
      parallel_for(0, a.c / 8, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t gi = g0; gi < g1; ++gi) {
          group_backward(a, Group{gi * 8, a.block, a.c / a.block}, x, dy, relu_y, gamma, mean,
                         invstd, dx, dgamma, dbeta);
        }
      });
    }
    return;
  }
  const double m = static_cast<double>(a.n * a.hw);
  parallel_for(0, a.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float mu = mean[c], is = invstd[c];
      double sum_dy = 0.0, sum_dy_xhat = 0.0;
      for (int64_t n = 0; n < a.n; ++n) {
        const int64_t row = (n * a.c + c) * a.hw;
        for_chunks(dy + row, a.hw, [&](const float* g, int64_t len, int64_t o) {
          float staged[kChunk], masked[kChunk];
          const float* xc = staged;
          if constexpr (std::is_same_v<T, float>) {
            xc = x + row + o;
          } else {
            cpu_io::load_n(x + row + o, staged, len);
          }
          if (relu_y) {  // f32, bf16 (check_common)
            for (int64_t i = 0; i < len; ++i)
              masked[i] = cpu_io::load(relu_y, row + o + i) > 0.0f ? g[i] : 0.0f;
            g = masked;
          }
          sum_dy += lane_sum(g, len, [](v8 v) { return v; });
          // x rides along as the lane sum's second stream: chunk element i of both.
          float prod[kChunk];
          for (int64_t i = 0; i < len; ++i) prod[i] = (g[i] * (xc[i] - mu)) * is;
          sum_dy_xhat += lane_sum(prod, len, [](v8 v) { return v; });
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
          if (relu_y) {
            const float* yc = relu_y + row;
#pragma omp simd
            for (int64_t i = 0; i < a.hw; ++i) {
              const float gi = yc[i] > 0.0f ? g[i] : 0.0f;
              out[i] = dx_of(gi, xc[i], mu, is, k, mean_dy, mean_dy_xhat);
            }
            continue;
          }
#pragma omp simd
          for (int64_t i = 0; i < a.hw; ++i) {
            out[i] = dx_of(g[i], xc[i], mu, is, k, mean_dy, mean_dy_xhat);
          }
          continue;
        }
        for_chunks(dy + row, a.hw, [&](const float* g, int64_t len, int64_t o) {
          float xc[kChunk], out[kChunk], masked[kChunk];
          cpu_io::load_n(x + row + o, xc, len);
          if (relu_y) {
            for (int64_t i = 0; i < len; ++i)
              masked[i] = cpu_io::load(relu_y, row + o + i) > 0.0f ? g[i] : 0.0f;
            g = masked;
          }
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) {
            out[i] = dx_of(g[i], xc[i], mu, is, k, mean_dy, mean_dy_xhat);
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
  DTRAIN_CHECK(a.block == 0 || ((a.block == 8 || a.block == 16) && a.c % a.block == 0 &&
                                x.dtype() != DType::f16 && x.device().is_cpu()),
               "{}: channel block {} needs f32 or bf16 on the CPU and C {} a multiple of it", op,
               a.block, a.c);
  DTRAIN_CHECK(!a.relu || (x.dtype() != DType::f16 && x.device().is_cpu()),
               "{}: the fused ReLU is f32 or bf16 on the CPU only, not {}", op, x.str());
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
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& relu_y) {
  constexpr std::string_view op = "batch_norm_backward";
  const Device device =
      same_device(op, {&x, &dy, &gamma, &save_mean, &save_invstd, &dx, &dgamma, &dbeta});
  check_common(op, args, x, dx, {&gamma, &save_mean, &save_invstd, &dgamma, &dbeta});
  require_dtype(op, "dy", dy, {x.dtype()});
  require_numel(op, "dy", dy, args.n * args.c * args.hw);
  if (args.relu) {
    require_dtype(op, "relu_y", relu_y, {x.dtype()});
    require_numel(op, "relu_y", relu_y, args.n * args.c * args.hw);
  }
  if (device.is_cuda()) {
    return cuda_ops::batch_norm_backward(args, x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                                         dbeta);
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    backward(args, x.data<T>(), dy.data<T>(), args.relu ? relu_y.data<T>() : nullptr,
             gamma.data<float>(), save_mean.data<float>(), save_invstd.data<float>(), dx.data<T>(),
             dgamma.data<float>(), dbeta.data<float>());
  });
}

}  // namespace dtrain::kernels
