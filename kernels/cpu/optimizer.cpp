// CPU fused optimizer steps (kernels/optimizer.h): one pass over the range in
// f32, in element order; the caller (src/optim) runs chunks on its threads.
// Half parameters and the copy go through tiles of cpu_io::kBlock f32 elements
// (widened, updated by the same f32 loop, rounded back), so the arithmetic is the
// f32 path's whatever the dtypes. Built with -fno-math-errno so the sqrt loop
// vectorises (IEEE sqrt either way).
#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/sum_squares.h"

namespace dtrain::kernels {
namespace {

void sgd_plain(float* p, const float* g, int64_t n, const SgdStep& k) {
  for (int64_t i = 0; i < n; ++i) p[i] -= k.lr * (g[i] * k.gscale + k.wd * p[i]);
}

template <SgdMomentum M>
void sgd_momentum(float* p, const float* g, float* buf, int64_t n, const SgdStep& k) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] * k.gscale + k.wd * p[i];
    const float b = k.mu * buf[i] + d;
    buf[i] = b;
    p[i] -= k.lr * (M == SgdMomentum::nesterov ? d + k.mu * b : b);
  }
}

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamStep& k) {
  const float step_size = k.lr / k.bc1;
  const float keep = 1.0f - k.lr * k.wd;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * k.gscale;
    m[i] = k.b1 * m[i] + k.one_minus_b1 * gi;
    v[i] = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
    const float denom = std::sqrt(v[i]) / k.sqrt_bc2 + k.eps;
    p[i] = p[i] * keep - step_size * (m[i] / denom);
  }
}

void moments(const float* g, float* m, float* v, int64_t n, const AdamStep& k) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * k.gscale;
    m[i] = k.b1 * m[i] + k.one_minus_b1 * gi;
    v[i] = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
  }
}

// Calls fn(T{}) with T the storage type of a float dtype (f32, f16, bf16).
template <typename Fn>
void dispatch_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::f16:
      return fn(f16{});
    case DType::bf16:
      return fn(bf16{});
    default:
      return fn(float{});
  }
}

// Runs body(p_f32, at, len) over [0, n) of the parameters: on p itself when it is
// f32 and nothing is copied, else tile by tile: p widened into an f32 tile, the
// body on the tile, the tile rounded back into p and into the copy.
template <typename Body>
void over_params(Tensor& p, Tensor* copy, Body&& body) {
  const int64_t n = p.numel();
  if (p.dtype() == DType::f32 && copy == nullptr) return body(p.data<float>(), 0, n);
  dispatch_float(p.dtype(), [&](auto ptag) {
    using P = decltype(ptag);
    P* pp = static_cast<P*>(p.raw());
    auto run = [&](auto* cp) {
      float tile[cpu_io::kBlock];
      for (int64_t i = 0; i < n; i += cpu_io::kBlock) {
        const int64_t len = std::min(cpu_io::kBlock, n - i);
        float* t = tile;
        if constexpr (std::is_same_v<P, float>) {
          t = pp + i;
        } else {
          cpu_io::load_n(pp + i, tile, len);
        }
        body(t, i, len);
        if constexpr (!std::is_same_v<P, float>) cpu_io::store_n(tile, pp + i, len);
        using C = std::remove_pointer_t<decltype(cp)>;
        if constexpr (std::is_same_v<C, float>) {
          std::memcpy(cp + i, t, static_cast<size_t>(len) * sizeof(float));
        } else if constexpr (!std::is_same_v<C, std::nullptr_t>) {
          cpu_io::store_n(t, cp + i, len);
        }
      }
    };
    if (copy == nullptr) {
      run(static_cast<std::nullptr_t*>(nullptr));
    } else {
      dispatch_float(copy->dtype(), [&](auto ctag) {
        using C = decltype(ctag);
        run(static_cast<C*>(copy->raw()));
      });
    }
  });
}

void check_param_and_copy(std::string_view op, const Tensor& p, const Tensor* copy) {
  require_dtype(op, "p", p, {DType::f32, DType::f16, DType::bf16});
  if (copy == nullptr) return;
  same_device(op, {&p, copy});
  require_dtype(op, "copy", *copy, {DType::f32, DType::f16, DType::bf16});
  require_numel(op, "copy", *copy, p.numel());
}

// u[i] for i in [0, n): the LAMB direction, the same expression in both passes.
void lamb_direction(const float* p, const float* m, const float* v, int64_t n, const AdamStep& k,
                    float wd, float* u) {
  for (int64_t i = 0; i < n; ++i)
    u[i] = (m[i] / k.bc1) / (std::sqrt(v[i]) / k.sqrt_bc2 + k.eps) + wd * p[i];
}

struct LambTable {
  const int64_t* ranges;
  const float* wd;
  int64_t chunks;
};

// Checks dtypes and sizes (any device); returns the number of chunks.
int64_t check_lamb(std::string_view op, const Tensor& ranges, const Tensor& wd, const Tensor& p,
                   std::initializer_list<const Tensor*> same_size) {
  require_dtype(op, "ranges", ranges, {DType::i64});
  require_dtype(op, "wd", wd, {DType::f32});
  const int64_t chunks = wd.numel();
  require_numel(op, "ranges", ranges, 2 * chunks);
  require_dtype(op, "p", p, {DType::f32});
  for (const Tensor* t : same_size) {
    require_dtype(op, "g/m/v", *t, {DType::f32});
    require_numel(op, "g/m/v", *t, p.numel());
  }
  return chunks;
}

// The host table, each range checked against the buffers.
LambTable host_table(std::string_view op, const Tensor& ranges, const Tensor& wd, int64_t n) {
  const int64_t* r = ranges.data<int64_t>();
  const int64_t chunks = wd.numel();
  for (int64_t c = 0; c < chunks; ++c) {
    DTRAIN_CHECK(0 <= r[2 * c] && r[2 * c] <= r[2 * c + 1] && r[2 * c + 1] <= n,
                 "{}: chunk {} is [{}, {}) of a {}-element buffer", op, c, r[2 * c], r[2 * c + 1],
                 n);
  }
  return {r, wd.data<float>(), chunks};
}

}  // namespace

void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum, Tensor* copy) {
  constexpr std::string_view op = "sgd_step";
  const Device device = same_device(op, {&p, &g, &momentum});
  check_param_and_copy(op, p, copy);
  require_dtype(op, "g", g, {DType::f32});
  require_numel(op, "g", g, p.numel());
  if (k.momentum != SgdMomentum::none) {
    require_dtype(op, "momentum", momentum, {DType::f32});
    require_numel(op, "momentum", momentum, p.numel());
  }
  if (device.is_cuda()) return cuda_ops::sgd_step(k, p, g, momentum, copy);
  const float* gp = g.data<float>();
  float* bp = k.momentum == SgdMomentum::none ? nullptr : momentum.data<float>();
  over_params(p, copy, [&](float* pt, int64_t at, int64_t n) {
    switch (k.momentum) {
      case SgdMomentum::none:
        return sgd_plain(pt, gp + at, n, k);
      case SgdMomentum::heavy_ball:
        return sgd_momentum<SgdMomentum::heavy_ball>(pt, gp + at, bp + at, n, k);
      case SgdMomentum::nesterov:
        return sgd_momentum<SgdMomentum::nesterov>(pt, gp + at, bp + at, n, k);
    }
  });
}

void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor* copy) {
  constexpr std::string_view op = "adamw_step";
  const Device device = same_device(op, {&p, &g, &m, &v});
  check_param_and_copy(op, p, copy);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&g, &m, &v}) {
    require_dtype(op, "g/m/v", *t, {DType::f32});
    require_numel(op, "g/m/v", *t, p.numel());
  }
  if (device.is_cuda()) return cuda_ops::adamw_step(k, p, g, m, v, copy);
  const float* gp = g.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  over_params(p, copy, [&](float* pt, int64_t at, int64_t n) {
    adamw(pt, gp + at, mp + at, vp + at, n, k);
  });
}

void ema_update(float rest, const Tensor& p, Tensor& ema) {
  constexpr std::string_view op = "ema_update";
  const Device device = same_device(op, {&p, &ema});
  require_dtype(op, "p", p, {DType::f32});
  require_dtype(op, "ema", ema, {DType::f32});
  require_numel(op, "ema", ema, p.numel());
  if (device.is_cuda()) return cuda_ops::ema_update(rest, p, ema);
  const float* pp = p.data<float>();
  float* ep = ema.data<float>();
  const int64_t n = p.numel();
  for (int64_t i = 0; i < n; ++i) ep[i] += rest * (pp[i] - ep[i]);
}

void lamb_moments(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& p,
                  const Tensor& g, Tensor& m, Tensor& v, Tensor& sums) {
  constexpr std::string_view op = "lamb_moments";
  const Device device = same_device(op, {&ranges, &wd, &p, &g, &m, &v, &sums});
  const int64_t chunks = check_lamb(op, ranges, wd, p, {&g, &m, &v});
  require_dtype(op, "sums", sums, {DType::f64});
  require_numel(op, "sums", sums, 2 * chunks);
  if (device.is_cuda()) return cuda_ops::lamb_moments(k, ranges, wd, p, g, m, v, sums);
  const LambTable h = host_table(op, ranges, wd, p.numel());
  const float* pp = p.data<float>();
  const float* gp = g.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  double* out = sums.data<double>();
  parallel_for(0, h.chunks, 1, [&](int64_t lo, int64_t hi) {
    float u[kLambTile];
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t at = h.ranges[2 * c], n = h.ranges[2 * c + 1] - at;
      moments(gp + at, mp + at, vp + at, n, k);
      double ps = 0, us = 0;
      for (int64_t i = 0; i < n; i += kLambTile) {
        const int64_t len = std::min(kLambTile, n - i);
        lamb_direction(pp + at + i, mp + at + i, vp + at + i, len, k, h.wd[c], u);
        ps += sum_squares(pp + at + i, len);
        us += sum_squares(u, len);
      }
      out[2 * c] = ps;
      out[2 * c + 1] = us;
    }
  });
}

void lamb_update(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& step,
                 Tensor& p, const Tensor& m, const Tensor& v) {
  constexpr std::string_view op = "lamb_update";
  const Device device = same_device(op, {&ranges, &wd, &step, &p, &m, &v});
  const int64_t chunks = check_lamb(op, ranges, wd, p, {&m, &v});
  require_dtype(op, "step", step, {DType::f32});
  require_numel(op, "step", step, chunks);
  if (device.is_cuda()) return cuda_ops::lamb_update(k, ranges, wd, step, p, m, v);
  const LambTable h = host_table(op, ranges, wd, p.numel());
  float* pp = p.data<float>();
  const float* mp = m.data<float>();
  const float* vp = v.data<float>();
  const float* sp = step.data<float>();
  parallel_for(0, h.chunks, 1, [&](int64_t lo, int64_t hi) {
    float u[kLambTile];
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t at = h.ranges[2 * c], n = h.ranges[2 * c + 1] - at;
      for (int64_t i = 0; i < n; i += kLambTile) {
        const int64_t len = std::min(kLambTile, n - i);
        lamb_direction(pp + at + i, mp + at + i, vp + at + i, len, k, h.wd[c], u);
        for (int64_t j = 0; j < len; ++j) pp[at + i + j] -= sp[c] * u[j];
      }
    }
  });
}

}  // namespace dtrain::kernels
