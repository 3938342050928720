// fp64 reference attention. Query i may see key j when key_mask[b, j] != 0 and,
// if causal, j <= i + (Tk - Tq). s_j = scale * q_i . k_j over visible j,
// p = softmax(s), out_i = sum_j p_j v_j, lse_i = log sum_j exp(s_j). With
// dropout, p_j is kept iff Philox(seed, stream).uniform(offset + ((b*H + h)*Tq + i)*Tk + j)
// >= dropout (one draw per element, in order) and kept ones are scaled by 1/(1-p).
#include "ref/attention.h"

#include <cmath>
#include <vector>

#include "core/rng.h"

namespace dtrain::ref {

void attention_forward(const kernels::AttentionArgs& a, const double* q, const double* k,
                       const double* v, const double* key_mask, double* out, double* lse) {
  const double scale = a.scale != 0.0f ? a.scale : 1.0 / std::sqrt(static_cast<double>(a.d));
  std::vector<double> s(static_cast<size_t>(a.tk));
  std::vector<char> visible(static_cast<size_t>(a.tk));
  const Philox rng(a.seed, a.stream);
  const double inv_keep = 1.0 / (1.0 - static_cast<double>(a.dropout));
  for (int64_t b = 0; b < a.b; ++b)
    for (int64_t h = 0; h < a.h; ++h) {
      const int64_t bh = b * a.h + h;
      for (int64_t i = 0; i < a.tq; ++i) {
        const double* qi = q + (bh * a.tq + i) * a.d;
        double* oi = out + (bh * a.tq + i) * a.d;
        double mx = -INFINITY;
        for (int64_t j = 0; j < a.tk; ++j) {
          const bool masked = key_mask != nullptr && key_mask[b * a.tk + j] == 0.0;
          const bool future = a.causal == kernels::Causal::yes && j > i + (a.tk - a.tq);
          visible[j] = !masked && !future;
          if (!visible[j]) continue;
          const double* kj = k + (bh * a.tk + j) * a.d;
          double dot = 0.0;
          for (int64_t d = 0; d < a.d; ++d) dot += qi[d] * kj[d];
          s[j] = scale * dot;
          mx = std::max(mx, s[j]);
        }
        for (int64_t d = 0; d < a.d; ++d) oi[d] = 0.0;
        if (mx == -INFINITY) {
          lse[bh * a.tq + i] = -INFINITY;
          continue;
        }
        double denom = 0.0;
        for (int64_t j = 0; j < a.tk; ++j)
          if (visible[j]) denom += std::exp(s[j] - mx);
        for (int64_t j = 0; j < a.tk; ++j) {
          if (!visible[j]) continue;
          double p = std::exp(s[j] - mx) / denom;
          if (a.dropout > 0.0f) {
            const auto e = a.offset + static_cast<uint64_t>((bh * a.tq + i) * a.tk + j);
            p = rng.uniform(e) >= a.dropout ? p * inv_keep : 0.0;
          }
          const double* vj = v + (bh * a.tk + j) * a.d;
          for (int64_t d = 0; d < a.d; ++d) oi[d] += p * vj[d];
        }
        lse[bh * a.tq + i] = mx + std::log(denom);
      }
    }
}

}  // namespace dtrain::ref
