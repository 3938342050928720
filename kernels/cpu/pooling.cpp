// CPU max / average pooling over NCHW planes (or channel-blocked ones: a plane's
// elements B apart; f32 and bf16) and global average pooling. One thread per (n, c) plane;
// blocked max pooling takes eight channels per vector, lane by lane the same rules. Backward is a
// gather (each input element sums the windows that contain it, in (oh, ow) order), so it needs no
// scratch, writes each dx once and rounds half outputs once; max pooling scatters instead, to
// the same bits (halves into a thread's f32 plane, then rounded once: ResNet-50's bf16 stem
// pool backward went from 78 to 5 ms). Computes in f32; no workspace.
#include "kernels/pooling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {
namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

struct Window {
  int64_t h0, h1, w0, w1;  // in-bounds rows [h0, h1), cols [w0, w1)
};

Window window(const Pool2dArgs& a, int64_t oh, int64_t ow) {
  const int64_t hs = oh * a.stride_h - a.pad_h, ws = ow * a.stride_w - a.pad_w;
  return {std::max<int64_t>(hs, 0), std::min(hs + a.kernel_h, a.h), std::max<int64_t>(ws, 0),
          std::min(ws + a.kernel_w, a.w)};
}

float inv_divisor(const Pool2dArgs& a, const Window& win) {
  const int64_t count = a.pad_count == PadCount::include ? a.kernel_h * a.kernel_w
                                                         : (win.h1 - win.h0) * (win.w1 - win.w0);
  return 1.0f / static_cast<float>(count);
}

// Outputs whose window covers input index i along one axis: [lo, hi).
void covering(int64_t i, int64_t pad, int64_t kernel, int64_t stride, int64_t out, int64_t& lo,
              int64_t& hi) {
  lo = std::max<int64_t>(0, floor_div(i + pad - kernel, stride) + 1);
  hi = std::min(out, floor_div(i + pad, stride) + 1);
}

// One (n, c) plane: element (h, w) at x[(h * W + w) * st], output o at y[o * st] (st: 1
// plain, B blocked); argmax lies as y and holds h * W + w.
template <typename T>
void forward_plane(PoolKind kind, const Pool2dArgs& a, const T* x, T* y, int32_t* argmax,
                   int64_t st) {
  const int64_t oh_n = a.out_h(), ow_n = a.out_w();
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const Window win = window(a, oh, ow);
      const int64_t o = oh * ow_n + ow;
      if (kind == PoolKind::avg) {
        float sum = 0.0f;
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += cpu_io::load(x, (ih * a.w + iw) * st);
        cpu_io::store(y, o * st, sum * inv_divisor(a, win));
        continue;
      }
      // Branch-free first: the comparisons of data after a ReLU (many ties at zero) are
      // unpredictable, and a mispredicted branch per element cost more than the loads.
      // A NaN in the window (v != v) sends it to the exact rules below.
      float best = -INFINITY;
      int64_t best_i = win.h0 * a.w + win.w0;
      bool nan = false;
      for (int64_t ih = win.h0; ih < win.h1; ++ih) {
        for (int64_t iw = win.w0; iw < win.w1; ++iw) {
          const float v = cpu_io::load(x, (ih * a.w + iw) * st);
          nan |= v != v;
          const bool greater = v > best;  // strictly: the first maximum wins
          best_i = greater ? ih * a.w + iw : best_i;
          best = greater ? v : best;
        }
      }
      if (!nan) {
        cpu_io::store(y, o * st, best);
        argmax[o * st] = static_cast<int32_t>(best_i);
        continue;
      }
      best = -INFINITY;
      best_i = win.h0 * a.w + win.w0;
      for (int64_t ih = win.h0; ih < win.h1 && !std::isnan(best); ++ih) {
        for (int64_t iw = win.w0; iw < win.w1; ++iw) {
          const float v = cpu_io::load(x, (ih * a.w + iw) * st);
          if (v > best || std::isnan(v)) {  // first maximum wins; NaN propagates
            best = v;
            best_i = ih * a.w + iw;
            if (std::isnan(v)) break;
          }
        }
      }
      cpu_io::store(y, o * st, best);
      argmax[o * st] = static_cast<int32_t>(best_i);
    }
  }
}

template <typename T>
void backward_plane(PoolKind kind, const Pool2dArgs& a, const T* dy, const int32_t* argmax, T* dx,
                    int64_t st) {
  const int64_t oh_n = a.out_h(), ow_n = a.out_w();
  if constexpr (std::is_same_v<T, float>) {
    if (kind == PoolKind::max) {
      // f32 max: each output's gradient into its argmax, in output order. Every input
      // element then sums the same values in the same order as the gather below
      // (from 0, over its windows in (oh, ow) order): the same bits, with one visit per
      // output instead of one per window an input sits in.
      for (int64_t i = 0; i < a.h * a.w; ++i) dx[i * st] = 0.0f;
      for (int64_t o = 0; o < oh_n * ow_n; ++o) dx[argmax[o * st] * st] += dy[o * st];
      return;
    }
  } else if (kind == PoolKind::max) {
    // Half max: the same scatter into an f32 plane, rounded once per element as the
    // gather below would (the same sums in the same order: the same bits).
    thread_local std::vector<float> acc;
    acc.assign(static_cast<size_t>(a.h * a.w), 0.0f);
    for (int64_t o = 0; o < oh_n * ow_n; ++o)
      acc[static_cast<size_t>(argmax[o * st])] += cpu_io::load(dy, o * st);
    for (int64_t i = 0; i < a.h * a.w; ++i) cpu_io::store(dx, i * st, acc[static_cast<size_t>(i)]);
    return;
  }
  for (int64_t ih = 0; ih < a.h; ++ih) {
    int64_t oh0, oh1;
    covering(ih, a.pad_h, a.kernel_h, a.stride_h, oh_n, oh0, oh1);
    for (int64_t iw = 0; iw < a.w; ++iw) {
      int64_t ow0, ow1;
      covering(iw, a.pad_w, a.kernel_w, a.stride_w, ow_n, ow0, ow1);
      const int32_t self = static_cast<int32_t>(ih * a.w + iw);
      float acc = 0.0f;
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        for (int64_t ow = ow0; ow < ow1; ++ow) {
          const int64_t o = oh * ow_n + ow;
          if (kind == PoolKind::max) {
            if (argmax[o * st] == self) acc += cpu_io::load(dy, o * st);
          } else {
            acc += cpu_io::load(dy, o * st) * inv_divisor(a, window(a, oh, ow));
          }
        }
      }
      cpu_io::store(dx, self * st, acc);
    }
  }
}

using v8 = cpu_io::v8f;
using v8i = int32_t __attribute__((vector_size(32)));

// Blocked max pooling (f32, bf16), eight channels at once (x, y, argmax at an image's
// group: position p at [p * B]). The same rules as forward_plane's branch-free loop, lane
// by lane; false when some window held a NaN (the caller then runs forward_plane per
// lane). A bf16 maximum is one of its inputs: stored back, exactly.
template <typename T>
bool max_group8(const Pool2dArgs& a, const T* x, T* y, int32_t* argmax, int64_t st) {
  const int64_t oh_n = a.out_h(), ow_n = a.out_w();
  v8i nan = {};
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const Window win = window(a, oh, ow);
      v8 best = v8{} - INFINITY;
      v8i best_i = v8i{} + static_cast<int32_t>(win.h0 * a.w + win.w0);
      for (int64_t ih = win.h0; ih < win.h1; ++ih) {
        for (int64_t iw = win.w0; iw < win.w1; ++iw) {
          const v8 v = cpu_io::load8(x + (ih * a.w + iw) * st);
          nan |= v != v;
          const v8i greater = v > best;
          best_i = greater ? v8i{} + static_cast<int32_t>(ih * a.w + iw) : best_i;
          best = greater ? v : best;
        }
      }
      const int64_t o = oh * ow_n + ow;
      cpu_io::store8(y + o * st, best);
      std::memcpy(argmax + o * st, &best_i, sizeof best_i);
    }
  }
  for (int l = 0; l < 8; ++l)
    if (nan[l]) return false;
  return true;
}

// Planes of a tensor: plain, plane p = n * C + c at p * size; blocked [N, C/B, HW, B],
// channel c of image n at ((n * C/B + c / B) * size) * B + c % B, stride B.
struct Planes {
  int64_t c, block;
  int64_t offset(int64_t p, int64_t size) const {
    if (block == 0) return p * size;
    const int64_t n = p / c, ch = p % c;
    return ((n * (c / block) + ch / block) * size) * block + ch % block;
  }
  int64_t stride() const { return block == 0 ? 1 : block; }
};

void check_pool(std::string_view op, const Pool2dArgs& a) {
  DTRAIN_CHECK(a.n > 0 && a.c > 0 && a.h > 0 && a.w > 0 && a.kernel_h > 0 && a.kernel_w > 0 &&
                   a.stride_h > 0 && a.stride_w > 0,
               "{}: bad shape n {} c {} h {} w {} kernel {}x{} stride {},{}", op, a.n, a.c, a.h,
               a.w, a.kernel_h, a.kernel_w, a.stride_h, a.stride_w);
  // Every window then holds at least one input element (PyTorch's rule too).
  DTRAIN_CHECK(
      a.pad_h >= 0 && a.pad_w >= 0 && 2 * a.pad_h <= a.kernel_h && 2 * a.pad_w <= a.kernel_w,
      "{}: padding {},{} must be at most half the kernel {}x{}", op, a.pad_h, a.pad_w, a.kernel_h,
      a.kernel_w);
  DTRAIN_CHECK(a.out_h() > 0 && a.out_w() > 0, "{}: empty output", op);
}

// A channel block (0: NCHW) of c channels for tensor t.
void check_block(std::string_view op, int64_t block, int64_t c, const Tensor& t) {
  DTRAIN_CHECK(block == 0 || ((block == 8 || block == 16) && c % block == 0),
               "{}: channel block {} of {} channels", op, block, c);
  DTRAIN_CHECK(block == 0 || (t.dtype() != DType::f16 && t.device().is_cpu()),
               "{}: channel blocks are f32 or bf16 on the CPU only, not {}", op, t.str());
}

}  // namespace

void pool2d_forward(PoolKind kind, const Pool2dArgs& args, const Tensor& x, Tensor& y,
                    Tensor& argmax) {
  constexpr std::string_view op = "pool2d_forward";
  const Device device = same_device(op, {&x, &y, &argmax});
  check_pool(op, args);
  require_dtype(op, "x", x, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "y", y, {x.dtype()});
  const int64_t planes = args.n * args.c, in = args.h * args.w, out = args.out_h() * args.out_w();
  require_numel(op, "x", x, planes * in);
  require_numel(op, "y", y, planes * out);
  int32_t* am = nullptr;
  if (kind == PoolKind::max) {
    require_dtype(op, "argmax", argmax, {DType::i32});
    require_numel(op, "argmax", argmax, planes * out);
  }
  check_block(op, args.block, args.c, x);
  if (device.is_cuda()) return cuda_ops::pool2d_forward(kind, args, x, y, argmax);
  if (kind == PoolKind::max) am = argmax.data<int32_t>();
  const Planes pl{args.c, args.block};
  if (kind == PoolKind::max && args.block > 0) {  // eight channels per vector
    const auto groups = [&](auto* xp, auto* yp) {
      parallel_for(0, planes / 8, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t xo = pl.offset(g * 8, in), yo = pl.offset(g * 8, out);
          if (max_group8(args, xp + xo, yp + yo, am + yo, args.block)) continue;
          for (int64_t l = 0; l < 8; ++l) {
            forward_plane(kind, args, xp + xo + l, yp + yo + l, am + yo + l, args.block);
          }
        }
      });
    };
    if (x.dtype() == DType::f32) return groups(x.data<float>(), y.data<float>());
    return groups(x.data<bf16>(), y.data<bf16>());  // check_block: f32 or bf16
  }
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    parallel_for(0, planes, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t yo = pl.offset(p, out);
        forward_plane(kind, args, xp + pl.offset(p, in), yp + yo, am ? am + yo : nullptr,
                      pl.stride());
      }
    });
  });
}

void pool2d_backward(PoolKind kind, const Pool2dArgs& args, const Tensor& dy, const Tensor& argmax,
                     Tensor& dx) {
  constexpr std::string_view op = "pool2d_backward";
  const Device device = same_device(op, {&dy, &argmax, &dx});
  check_pool(op, args);
  require_dtype(op, "dy", dy, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "dx", dx, {dy.dtype()});
  const int64_t planes = args.n * args.c, in = args.h * args.w, out = args.out_h() * args.out_w();
  require_numel(op, "dy", dy, planes * out);
  require_numel(op, "dx", dx, planes * in);
  const int32_t* am = nullptr;
  if (kind == PoolKind::max) {
    require_dtype(op, "argmax", argmax, {DType::i32});
    require_numel(op, "argmax", argmax, planes * out);
  }
  check_block(op, args.block, args.c, dy);
  if (device.is_cuda()) return cuda_ops::pool2d_backward(kind, args, dy, argmax, dx);
  if (kind == PoolKind::max) am = argmax.data<int32_t>();
  const Planes pl{args.c, args.block};
  cpu_io::dispatch_float(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = dy.data<T>();
    T* d = dx.data<T>();
    parallel_for(0, planes, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t go = pl.offset(p, out);
        backward_plane(kind, args, g + go, am ? am + go : nullptr, d + pl.offset(p, in),
                       pl.stride());
      }
    });
  });
}

void global_avg_pool_forward(int64_t n, int64_t c, int64_t hw, const Tensor& x, Tensor& y,
                             int64_t block) {
  constexpr std::string_view op = "global_avg_pool_forward";
  const Device device = same_device(op, {&x, &y});
  DTRAIN_CHECK(n > 0 && c > 0 && hw > 0, "{}: empty shape {}x{}x{}", op, n, c, hw);
  require_dtype(op, "x", x, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "y", y, {x.dtype()});
  require_numel(op, "x", x, n * c * hw);
  require_numel(op, "y", y, n * c);
  check_block(op, block, c, x);
  if (device.is_cuda()) return cuda_ops::global_avg_pool_forward(n, c, hw, x, y);
  const Planes pl{c, block};
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    parallel_for(0, n * c, 16, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* plane = xp + pl.offset(p, hw);
        float sum = 0.0f;
        for (int64_t i = 0; i < hw; ++i) sum += cpu_io::load(plane, i * pl.stride());
        cpu_io::store(yp, p, sum / static_cast<float>(hw));
      }
    });
  });
}

void global_avg_pool_backward(int64_t n, int64_t c, int64_t hw, const Tensor& dy, Tensor& dx,
                              int64_t block) {
  constexpr std::string_view op = "global_avg_pool_backward";
  const Device device = same_device(op, {&dy, &dx});
  DTRAIN_CHECK(n > 0 && c > 0 && hw > 0, "{}: empty shape {}x{}x{}", op, n, c, hw);
  require_dtype(op, "dy", dy, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "dx", dx, {dy.dtype()});
  require_numel(op, "dy", dy, n * c);
  require_numel(op, "dx", dx, n * c * hw);
  check_block(op, block, c, dy);
  if (device.is_cuda()) return cuda_ops::global_avg_pool_backward(n, c, hw, dy, dx);
  const Planes pl{c, block};
  cpu_io::dispatch_float(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = dy.data<T>();
    T* d = dx.data<T>();
    parallel_for(0, n * c, 16, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        T v;
        cpu_io::store(&v, 0, cpu_io::load(g, p) / static_cast<float>(hw));
        T* plane = d + pl.offset(p, hw);
        for (int64_t i = 0; i < hw; ++i) plane[i * pl.stride()] = v;
      }
    });
  });
}

}  // namespace dtrain::kernels
