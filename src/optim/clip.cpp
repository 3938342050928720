// Global-norm clipping (see clip.h): a blocked double sum of squares, then one scale.
#include "optim/clip.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "optim/sum_squares.h"

namespace dtrain::optim {
namespace {

float* host_f32(const Tensor& t) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::f32 && t.device().is_cpu(),
               "gradient buffer must be host f32, got {}", t.defined() ? t.str() : "undefined");
  return t.data<float>();
}

}  // namespace

double grad_sum_squares(const Tensor& grads) {
  const float* g = host_f32(grads);
  const int64_t n = grads.numel();
  const int64_t blocks = (n + kClipBlock - 1) / kClipBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t begin = b * kClipBlock;
      partial[b] = sum_squares(g + begin, std::min(kClipBlock, n - begin));
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

Clipped clip_to_norm(Tensor& grads, double norm, double max_norm) {
  DTRAIN_CHECK(max_norm > 0, "max_norm {} must be positive", max_norm);
  const double coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || coef >= 1.0) return Clipped::no;
  float* g = host_f32(grads);
  const float c = static_cast<float>(coef);
  parallel_for(0, grads.numel(), kClipBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) g[i] *= c;
  });
  return Clipped::yes;
}

double clip_grad_norm(Tensor& grads, double max_norm) {
  const double norm = std::sqrt(grad_sum_squares(grads));
  clip_to_norm(grads, norm, max_norm);
  return norm;
}

}  // namespace dtrain::optim
