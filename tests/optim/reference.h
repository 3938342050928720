// Test-only fp64 references of the optimizer updates, written element by element
// straight from the documented equations (PyTorch SGD / AdamW, the LAMB paper), plus
// a deterministic data generator. The spec the fused f32 loops are checked against.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "optim/options.h"
#include "optim/segments.h"

namespace dtrain::optim::test {

// Deterministic values in [-1, 1): a 64-bit LCG, independent of the library.
inline std::vector<float> pattern(int64_t n, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : out) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return out;
}

struct RefState {
  std::vector<double> p, a, b;  // params, first buffer (momentum / m), second (v)
  int64_t t = 0;
};

inline RefState ref_init(const std::vector<float>& p) {
  RefState s;
  s.p.assign(p.begin(), p.end());
  s.a.assign(p.size(), 0.0);
  s.b.assign(p.size(), 0.0);
  return s;
}

inline double ref_wd(const OptimizerOptions& o, const ParamSegment& seg) {
  return seg.decay == DecayMode::decay ? o.weight_decay : 0.0;
}

inline void ref_sgd(RefState& s, const std::vector<float>& g, const std::vector<ParamSegment>& segs,
                    const OptimizerOptions& o, double lr) {
  ++s.t;
  for (const auto& seg : segs)
    for (int64_t i = seg.offset; i < seg.offset + seg.size; ++i) {
      double d = g[i] + ref_wd(o, seg) * s.p[i];
      if (o.momentum != 0) {
        s.a[i] = s.t == 1 ? d : o.momentum * s.a[i] + d;
        d = o.nesterov ? d + o.momentum * s.a[i] : s.a[i];
      }
      s.p[i] -= lr * d;
    }
}

inline void ref_moments(RefState& s, const std::vector<float>& g, int64_t i,
                        const OptimizerOptions& o) {
  s.a[i] = o.betas[0] * s.a[i] + (1 - o.betas[0]) * g[i];
  s.b[i] = o.betas[1] * s.b[i] + (1 - o.betas[1]) * double(g[i]) * g[i];
}

inline void ref_adamw(RefState& s, const std::vector<float>& g,
                      const std::vector<ParamSegment>& segs, const OptimizerOptions& o, double lr) {
  ++s.t;
  const double bc1 = 1 - std::pow(o.betas[0], double(s.t));
  const double bc2 = 1 - std::pow(o.betas[1], double(s.t));
  for (const auto& seg : segs)
    for (int64_t i = seg.offset; i < seg.offset + seg.size; ++i) {
      s.p[i] *= 1 - lr * ref_wd(o, seg);
      ref_moments(s, g, i, o);
      const double mhat = s.a[i] / bc1, vhat = s.b[i] / bc2;
      s.p[i] -= lr * mhat / (std::sqrt(vhat) + o.eps);
    }
}

inline void ref_lamb(RefState& s, const std::vector<float>& g,
                     const std::vector<ParamSegment>& segs, const OptimizerOptions& o, double lr) {
  ++s.t;
  const double bc1 = 1 - std::pow(o.betas[0], double(s.t));
  const double bc2 = 1 - std::pow(o.betas[1], double(s.t));
  for (const auto& seg : segs) {
    std::vector<double> u(static_cast<size_t>(seg.size));
    double pn = 0, un = 0;
    for (int64_t j = 0; j < seg.size; ++j) {
      const int64_t i = seg.offset + j;
      ref_moments(s, g, i, o);
      u[j] = (s.a[i] / bc1) / (std::sqrt(s.b[i] / bc2) + o.eps) + ref_wd(o, seg) * s.p[i];
      pn += s.p[i] * s.p[i];
      un += u[j] * u[j];
    }
    pn = std::sqrt(pn);
    un = std::sqrt(un);
    const double ratio = (pn > 0 && un > 0) ? pn / un : 1.0;
    for (int64_t j = 0; j < seg.size; ++j) s.p[seg.offset + j] -= lr * ratio * u[j];
  }
}

}  // namespace dtrain::optim::test
