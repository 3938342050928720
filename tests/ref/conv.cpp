// fp64 reference convolution. Every pass visits the same (n, k, oh, ow, c, r, s)
// tuples: input pixel ih = oh*stride - pad + r*dilation (skipped if outside).
#include "ref/conv.h"

#include <algorithm>
#include <functional>

namespace dtrain::ref {
namespace {

// Calls fn(x_index, w_index, y_index) for every multiply-add of the forward pass.
void for_each_tap(const kernels::Conv2dArgs& a,
                  const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int64_t oh_n = (a.h + 2 * a.pad_h - a.dilation_h * (a.r - 1) - 1) / a.stride_h + 1;
  const int64_t ow_n = (a.w + 2 * a.pad_w - a.dilation_w * (a.s - 1) - 1) / a.stride_w + 1;
  const int64_t cg = a.c / a.groups, kg = a.k / a.groups;  // channels per group
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t k = 0; k < a.k; ++k) {
      const int64_t g = k / kg;
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow)
          for (int64_t cl = 0; cl < cg; ++cl)
            for (int64_t r = 0; r < a.r; ++r)
              for (int64_t s = 0; s < a.s; ++s) {
                const int64_t ih = oh * a.stride_h - a.pad_h + r * a.dilation_h;
                const int64_t iw = ow * a.stride_w - a.pad_w + s * a.dilation_w;
                if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) continue;
                const int64_t c = g * cg + cl;
                fn(((n * a.c + c) * a.h + ih) * a.w + iw, ((k * cg + cl) * a.r + r) * a.s + s,
                   ((n * a.k + k) * oh_n + oh) * ow_n + ow);
              }
    }
}

int64_t out_elems(const kernels::Conv2dArgs& a) { return a.n * a.k * a.out_h() * a.out_w(); }

}  // namespace

void conv2d_forward(const kernels::Conv2dArgs& a, const double* x, const double* w, double* y) {
  std::fill(y, y + out_elems(a), 0.0);
  for_each_tap(a, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
}

void conv2d_backward_data(const kernels::Conv2dArgs& a, const double* dy, const double* w,
                          double* dx) {
  std::fill(dx, dx + a.n * a.c * a.h * a.w, 0.0);
  for_each_tap(a, [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += dy[yi] * w[wi]; });
}

void conv2d_backward_filter(const kernels::Conv2dArgs& a, const double* x, const double* dy,
                            double* dw) {
  std::fill(dw, dw + a.k * (a.c / a.groups) * a.r * a.s, 0.0);
  for_each_tap(a, [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += x[xi] * dy[yi]; });
}

}  // namespace dtrain::ref
