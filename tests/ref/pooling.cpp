// fp64 reference pooling. Window of output (oh, ow): rows oh*stride - pad ..
// + kernel - 1, clipped to the input. Average divides by kernel_h*kernel_w
// (pad counted) or by the number of in-bounds elements (pad excluded).
#include "ref/pooling.h"

#include <algorithm>
#include <cmath>

namespace dtrain::ref {
namespace {

struct Window {
  int64_t h0, h1, w0, w1;  // clipped [h0, h1) x [w0, w1)
};

Window window(const kernels::Pool2dArgs& a, int64_t oh, int64_t ow) {
  const int64_t hs = oh * a.stride_h - a.pad_h, ws = ow * a.stride_w - a.pad_w;
  return {std::max<int64_t>(hs, 0), std::min(hs + a.kernel_h, a.h), std::max<int64_t>(ws, 0),
          std::min(ws + a.kernel_w, a.w)};
}

double divisor(const kernels::Pool2dArgs& a, const Window& win) {
  if (a.pad_count == kernels::PadCount::include)
    return static_cast<double>(a.kernel_h * a.kernel_w);
  return static_cast<double>((win.h1 - win.h0) * (win.w1 - win.w0));
}

}  // namespace

void pool2d_forward(kernels::PoolKind kind, const kernels::Pool2dArgs& a, const double* x,
                    double* y, double* argmax) {
  const int64_t oh_n = a.out_h(), ow_n = a.out_w();
  for (int64_t p = 0; p < a.n * a.c; ++p) {
    const double* xp = x + p * a.h * a.w;  // one [H, W] plane
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const Window win = window(a, oh, ow);
        const int64_t o = (p * oh_n + oh) * ow_n + ow;
        if (kind == kernels::PoolKind::avg) {
          double sum = 0.0;
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += xp[ih * a.w + iw];
          y[o] = sum / divisor(a, win);
          continue;
        }
        double best = -INFINITY;
        int64_t best_i = win.h0 * a.w + win.w0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) {
            const double v = xp[ih * a.w + iw];
            if (std::isnan(best)) continue;
            if (v > best || std::isnan(v)) best = v, best_i = ih * a.w + iw;
          }
        y[o] = best;
        argmax[o] = static_cast<double>(best_i);
      }
  }
}

void pool2d_backward(kernels::PoolKind kind, const kernels::Pool2dArgs& a, const double* dy,
                     const double* argmax, double* dx) {
  const int64_t oh_n = a.out_h(), ow_n = a.out_w();
  std::fill(dx, dx + a.n * a.c * a.h * a.w, 0.0);
  for (int64_t p = 0; p < a.n * a.c; ++p) {
    double* dxp = dx + p * a.h * a.w;
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const int64_t o = (p * oh_n + oh) * ow_n + ow;
        if (kind == kernels::PoolKind::max) {
          dxp[static_cast<int64_t>(argmax[o])] += dy[o];
          continue;
        }
        const Window win = window(a, oh, ow);
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw)
            dxp[ih * a.w + iw] += dy[o] / divisor(a, win);
      }
  }
}

void global_avg_pool_forward(int64_t n, int64_t c, int64_t hw, const double* x, double* y) {
  for (int64_t p = 0; p < n * c; ++p) {
    double sum = 0.0;
    for (int64_t i = 0; i < hw; ++i) sum += x[p * hw + i];
    y[p] = sum / static_cast<double>(hw);
  }
}

void global_avg_pool_backward(int64_t n, int64_t c, int64_t hw, const double* dy, double* dx) {
  for (int64_t p = 0; p < n * c; ++p)
    for (int64_t i = 0; i < hw; ++i) dx[p * hw + i] = dy[p] / static_cast<double>(hw);
}

}  // namespace dtrain::ref
