// Global-norm clipping (see clip.h): a blocked double sum of squares, then one scale.
// On CUDA the norm is the reduce kernel's (its own fixed block order, f32 result),
// read back to the host, and the scale is one kernel.
#include "optim/clip.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "kernels/reduce.h"
#include "kernels/sum_squares.h"

namespace dtrain::optim {
namespace {

void check_grads(const Tensor& t) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::f32, "gradient buffer must be f32, got {}",
               t.defined() ? t.str() : "undefined");
}

double device_sum_squares(const Tensor& grads) {
  Allocator& alloc = kernels::device_allocator(grads.device());
  Tensor norm = Tensor::empty(Shape{1}, DType::f32, &alloc);
  Tensor ws =
      Tensor::empty(Shape{static_cast<int64_t>(kernels::reduce_workspace_bytes(grads.numel()))},
                    DType::u8, &alloc);
  kernels::reduce(kernels::Reduction::l2_norm, grads, norm, {ws.raw(), ws.nbytes()});
  Tensor host = Tensor::empty(Shape{1}, DType::f32);
  kernels::copy(norm, host);
  const double n = host.data<float>()[0];
  return n * n;
}

}  // namespace

double grad_sum_squares(const Tensor& grads) {
  check_grads(grads);
  if (grads.device().is_cuda()) return device_sum_squares(grads);
  const float* g = grads.data<float>();
  const int64_t n = grads.numel();
  const int64_t blocks = (n + kClipBlock - 1) / kClipBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t begin = b * kClipBlock;
      partial[b] = kernels::sum_squares(g + begin, std::min(kClipBlock, n - begin));
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

double clip_factor(double norm, double max_norm) {
  DTRAIN_CHECK(max_norm > 0, "max_norm {} must be positive", max_norm);
  const double coef = max_norm / (norm + 1e-6);
  return !std::isfinite(norm) || coef >= 1.0 ? 1.0 : coef;
}

Clipped clip_to_norm(Tensor& grads, double norm, double max_norm) {
  const double coef = clip_factor(norm, max_norm);
  if (coef == 1.0) return Clipped::no;
  check_grads(grads);
  const float c = static_cast<float>(coef);
  if (grads.device().is_cuda()) {
    kernels::scale(c, grads, grads);
    return Clipped::yes;
  }
  float* g = grads.data<float>();
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
