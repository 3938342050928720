// CUDA pooling: the loops of kernels/cpu/pooling.cpp with one thread per output
// element (forward) or per input element (backward, a gather over the windows
// that contain it, so each dx is written once, in the CPU's order, without
// atomics). Global average pooling: one thread per (n, c) plane, summed in order.
#include <cmath>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pooling.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

__device__ int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

struct Window {
  int64_t h0, h1, w0, w1;  // in-bounds rows [h0, h1), cols [w0, w1)
};

__device__ Window window(const PoolShape& s, int64_t oh, int64_t ow) {
  const int64_t hs = oh * s.stride_h - s.pad_h, ws = ow * s.stride_w - s.pad_w;
  return {hs > 0 ? hs : 0, hs + s.kernel_h < s.h ? hs + s.kernel_h : s.h, ws > 0 ? ws : 0,
          ws + s.kernel_w < s.w ? ws + s.kernel_w : s.w};
}

__device__ float inv_divisor(const PoolShape& s, const Window& win) {
  const int64_t count =
      s.count_padding ? s.kernel_h * s.kernel_w : (win.h1 - win.h0) * (win.w1 - win.w0);
  return 1.0f / static_cast<float>(count);
}

template <typename T>
__global__ void forward_kernel(PoolOp op, PoolShape s, const T* x, T* y, int32_t* argmax) {
  const int64_t out = s.out_h * s.out_w, total = s.planes * out;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t p = i / out, o = i % out, oh = o / s.out_w, ow = o % s.out_w;
    const T* xp = x + p * s.h * s.w;
    const Window win = window(s, oh, ow);
    if (op == PoolOp::avg) {
      float sum = 0.0f;
      for (int64_t ih = win.h0; ih < win.h1; ++ih)
        for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += load(xp, ih * s.w + iw);
      store(y, i, sum * inv_divisor(s, win));
      continue;
    }
    float best = -INFINITY;
    int64_t best_i = win.h0 * s.w + win.w0;
    bool nan = false;
    for (int64_t ih = win.h0; ih < win.h1 && !nan; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) {
        const float v = load(xp, ih * s.w + iw);
        if (v > best || isnan(v)) {  // first maximum wins; NaN propagates
          best = v;
          best_i = ih * s.w + iw;
          if (isnan(v)) {
            nan = true;
            break;
          }
        }
      }
    }
    store(y, i, best);
    argmax[i] = static_cast<int32_t>(best_i);
  }
}

// Outputs whose window covers input index i along one axis: [lo, hi).
__device__ void covering(int64_t i, int64_t pad, int64_t kernel, int64_t stride, int64_t out,
                         int64_t& lo, int64_t& hi) {
  lo = floor_div(i + pad - kernel, stride) + 1;
  lo = lo > 0 ? lo : 0;
  hi = floor_div(i + pad, stride) + 1;
  hi = hi < out ? hi : out;
}

template <typename T>
__global__ void backward_kernel(PoolOp op, PoolShape s, const T* dy, const int32_t* argmax, T* dx) {
  const int64_t in = s.h * s.w, out = s.out_h * s.out_w, total = s.planes * in;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t p = i / in, self = i % in, ih = self / s.w, iw = self % s.w;
    const T* g = dy + p * out;
    const int32_t* am = argmax != nullptr ? argmax + p * out : nullptr;
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, s.pad_h, s.kernel_h, s.stride_h, s.out_h, oh0, oh1);
    covering(iw, s.pad_w, s.kernel_w, s.stride_w, s.out_w, ow0, ow1);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = oh * s.out_w + ow;
        if (op == PoolOp::max) {
          if (am[o] == static_cast<int32_t>(self)) acc += load(g, o);
        } else {
          acc += load(g, o) * inv_divisor(s, window(s, oh, ow));
        }
      }
    }
    store(dx, i, acc);
  }
}

template <typename T>
__global__ void gap_forward_kernel(int64_t planes, int64_t hw, const T* x, T* y) {
  for (int64_t p = thread_index(); p < planes; p += thread_stride()) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hw; ++i) sum += load(x, p * hw + i);
    store(y, p, sum / static_cast<float>(hw));
  }
}

template <typename T>
__global__ void gap_backward_kernel(int64_t planes, int64_t hw, const T* dy, T* dx) {
  const int64_t total = planes * hw;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    store(dx, i, load(dy, i / hw) / static_cast<float>(hw));
  }
}

}  // namespace

void launch_pool2d_forward(PoolOp op, DType dtype, const PoolShape& s, const void* x, void* y,
                           int32_t* argmax, cudaStream_t stream) {
  const int64_t total = s.planes * s.out_h * s.out_w;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(op, s, static_cast<const T*>(x),
                                                                static_cast<T*>(y), argmax);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_pool2d_backward(PoolOp op, DType dtype, const PoolShape& s, const void* dy,
                            const int32_t* argmax, void* dx, cudaStream_t stream) {
  const int64_t total = s.planes * s.h * s.w;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(op, s, static_cast<const T*>(dy),
                                                                 argmax, static_cast<T*>(dx));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_global_avg_pool_forward(DType dtype, int64_t planes, int64_t hw, const void* x, void* y,
                                    cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gap_forward_kernel<T><<<grid_for(planes), kThreads, 0, stream>>>(
        planes, hw, static_cast<const T*>(x), static_cast<T*>(y));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_global_avg_pool_backward(DType dtype, int64_t planes, int64_t hw, const void* dy,
                                     void* dx, cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gap_backward_kernel<T><<<grid_for(planes * hw), kThreads, 0, stream>>>(
        planes, hw, static_cast<const T*>(dy), static_cast<T*>(dx));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
