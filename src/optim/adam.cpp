// AdamW and LAMB: Adam moments with bias correction (states "exp_avg", "exp_avg_sq").
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,   bc_k = 1 - b_k^t  (t from 1)
// AdamW (PyTorch): p = p (1 - lr wd);  p = p - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
// LAMB: u = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd p;  r = ||p|| / ||u|| per segment
//   (1 when either is 0);  p = p - lr r u.  wd = 0 on no_decay segments.
// LAMB runs two passes: moments + per-chunk norms, then the update with u recomputed
// bit-identically from (m, v, p), which costs flops but no buffer of the size of p.
#include <cmath>
#include <memory>

#include "core/parallel.h"
#include "kernels/optimizer.h"
#include "optim/algorithms.h"
#include "optim/sum_squares.h"

namespace dtrain::optim::detail {
namespace {

// The step's scalars, computed in double and rounded once to f32 (the fused
// kernel's own argument, so AdamW passes them through unchanged).
using AdamCoef = kernels::AdamStep;

AdamCoef adam_coef(const OptimizerOptions& o, int64_t t, double lr) {
  const double b1 = o.betas[0], b2 = o.betas[1];
  const double td = static_cast<double>(t);
  auto f = [](double x) { return static_cast<float>(x); };
  return {f(b1),
          f(1 - b1),
          f(b2),
          f(1 - b2),
          f(1 - std::pow(b1, td)),
          f(std::sqrt(1 - std::pow(b2, td))),
          f(o.eps),
          f(lr),
          0.0f};
}

// AdamW on one chunk: the fused kernel (kernels/optimizer.h) on views of the buffers.
void adamw_chunk(float* p, const float* g, float* m, float* v, int64_t n, const AdamCoef& k) {
  Tensor pt = chunk_view(p, 0, n), mt = chunk_view(m, 0, n), vt = chunk_view(v, 0, n);
  kernels::adamw_step(k, pt, chunk_view(g, 0, n), mt, vt);
}

void moments_chunk(const float* g, float* m, float* v, int64_t n, const AdamCoef& k) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + k.one_minus_b1 * g[i];
    v[i] = k.b2 * v[i] + k.one_minus_b2 * g[i] * g[i];
  }
}

// u[i] for i in [0, n): the LAMB direction, the same expression in both passes.
void lamb_direction(const float* p, const float* m, const float* v, int64_t n, const AdamCoef& k,
                    float* u) {
  for (int64_t i = 0; i < n; ++i)
    u[i] = (m[i] / k.bc1) / (std::sqrt(v[i]) / k.sqrt_bc2 + k.eps) + k.wd * p[i];
}

class AdamBase : public Optimizer {
 protected:
  AdamBase(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total)
      : Optimizer(o, std::move(s), total, {"exp_avg", "exp_avg_sq"}) {}

  // fn(chunk, coef with the chunk's wd, offset, length) over all chunks in parallel.
  template <typename Fn>
  void for_chunks(double lr, Fn&& fn) {
    const AdamCoef base = adam_coef(options(), step_, lr);
    const auto& cs = chunks();
    parallel_for(0, static_cast<int64_t>(cs.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const SegmentChunk& ch = cs[static_cast<size_t>(c)];
        AdamCoef k = base;
        k.wd = decay_of(ch);
        fn(c, k, ch.begin, ch.end - ch.begin);
      }
    });
  }
};

class AdamW final : public AdamBase {
 public:
  AdamW(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total)
      : AdamBase(o, std::move(s), total) {}

 private:
  void update(float* p, const float* g, double lr) override {
    float* m = state_data(0);
    float* v = state_data(1);
    for_chunks(lr, [&](int64_t, const AdamCoef& k, int64_t at, int64_t n) {
      adamw_chunk(p + at, g + at, m + at, v + at, n, k);
    });
  }
};

class Lamb final : public AdamBase {
 public:
  Lamb(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total)
      : AdamBase(o, std::move(s), total),
        p_sq_(chunks().size()),
        u_sq_(chunks().size()),
        ratio_(segments().size()) {}

 private:
  static constexpr int64_t kTile = 256;  // u is built tile by tile on the stack

  void update(float* p, const float* g, double lr) override {
    float* m = state_data(0);
    float* v = state_data(1);
    for_chunks(lr, [&](int64_t c, const AdamCoef& k, int64_t at, int64_t n) {
      moments_chunk(g + at, m + at, v + at, n, k);
      chunk_norms(p + at, m + at, v + at, n, k, c);
    });
    trust_ratios();
    for_chunks(lr, [&](int64_t c, const AdamCoef& k, int64_t at, int64_t n) {
      const int32_t seg = chunks()[static_cast<size_t>(c)].segment;
      const float step = static_cast<float>(lr * ratio_[static_cast<size_t>(seg)]);
      float u[kTile];
      for (int64_t t = 0; t < n; t += kTile) {
        const int64_t len = std::min(kTile, n - t);
        lamb_direction(p + at + t, m + at + t, v + at + t, len, k, u);
        for (int64_t i = 0; i < len; ++i) p[at + t + i] -= step * u[i];
      }
    });
  }

  // ||p||^2 and ||u||^2 of one chunk, tile sums added in tile order.
  void chunk_norms(const float* p, const float* m, const float* v, int64_t n, const AdamCoef& k,
                   int64_t c) {
    float u[kTile];
    double ps = 0, us = 0;
    for (int64_t t = 0; t < n; t += kTile) {
      const int64_t len = std::min(kTile, n - t);
      lamb_direction(p + t, m + t, v + t, len, k, u);
      ps += sum_squares(p + t, len);
      us += sum_squares(u, len);
    }
    p_sq_[static_cast<size_t>(c)] = ps;
    u_sq_[static_cast<size_t>(c)] = us;
  }

  // Per segment: chunk sums added in chunk order (chunks of a segment are consecutive).
  void trust_ratios() {
    std::vector<double> ps(segments().size(), 0.0), us(segments().size(), 0.0);
    for (size_t c = 0; c < chunks().size(); ++c) {
      const auto seg = static_cast<size_t>(chunks()[c].segment);
      ps[seg] += p_sq_[c];
      us[seg] += u_sq_[c];
    }
    for (size_t s = 0; s < ratio_.size(); ++s) {
      const double pn = std::sqrt(ps[s]), un = std::sqrt(us[s]);
      ratio_[s] = (pn > 0 && un > 0) ? pn / un : 1.0;
    }
  }

  std::vector<double> p_sq_, u_sq_;  // per chunk
  std::vector<double> ratio_;        // per segment
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                      int64_t total) {
  return std::make_unique<AdamW>(o, std::move(s), total);
}

std::unique_ptr<Optimizer> make_lamb(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                     int64_t total) {
  return std::make_unique<Lamb>(o, std::move(s), total);
}

}  // namespace dtrain::optim::detail
