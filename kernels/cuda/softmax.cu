// CUDA softmax and fused softmax + cross-entropy. Row kernels: one thread block
// per row, lse = max + log sum exp(x - max) with block_reduce's fixed order.
// The loss: after the lse kernel, one block of 32 warps; warp w takes rows
// w, w + 32, ... in order (the lane sum of x_j only with label smoothing),
// lane 0 keeps a double partial, and the 32 partials are added in warp order.
// dlogits: each row's block counts the non-ignored targets itself (exact
// integer counts), so the API needs no workspace. No atomics anywhere.
#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/softmax.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr int kRowThreads = 256;
constexpr int kLossWarps = 32;

template <typename T>
__device__ float row_lse(const T* x, int64_t cols, float* shared) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = MaxOp{}(mx, load(x, j));
  mx = block_reduce(mx, MaxOp{}, -INFINITY, shared);
  if (isinf(mx)) return mx;  // all -inf (or a +inf): nothing finite to normalise
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(load(x, j) - mx);
  return mx + logf(block_reduce(s, SumOp{}, 0.0f, shared));
}

template <typename T>
__global__ void softmax_kernel(int64_t cols, const T* x, T* y) {
  __shared__ float shared[32];
  const T* xr = x + blockIdx.x * cols;
  const float lse = row_lse(xr, cols, shared);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    store(y + blockIdx.x * cols, j, expf(load(xr, j) - lse));
  }
}

template <typename T>
__global__ void softmax_grad_kernel(int64_t cols, const T* y, const T* dy, T* dx) {
  __shared__ float shared[32];
  const int64_t base = blockIdx.x * cols;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dot += load(dy + base, j) * load(y + base, j);
  dot = block_reduce(dot, SumOp{}, 0.0f, shared);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    store(dx + base, j, load(y + base, j) * (load(dy + base, j) - dot));
  }
}

template <typename T>
__global__ void lse_kernel(int64_t cols, const T* x, float* lse) {
  __shared__ float shared[32];
  const float v = row_lse(x + blockIdx.x * cols, cols, shared);
  if (threadIdx.x == 0) lse[blockIdx.x] = v;
}

__device__ bool is_valid(const XentShape& s, int32_t t) { return t >= 0 && t < s.classes; }

// Row loss = lse - (1 - eps) x_t - (eps / C) sum_j x_j, as on the CPU.
template <typename T>
__global__ void loss_kernel(XentShape s, const T* x, const int32_t* t, const float* lse,
                            float* loss) {
  __shared__ double total[kLossWarps];
  __shared__ long long counted[kLossWarps];
  __shared__ int bad[kLossWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double acc = 0.0;
  long long n = 0;
  int invalid = 0;
  for (int64_t r = warp; r < s.rows; r += kLossWarps) {
    const T* xr = x + r * s.classes;
    float sum = 0.0f;
    if (s.label_smoothing != 0.0f) {
      for (int64_t j = lane; j < s.classes; j += 32) sum += load(xr, j);
      sum = warp_reduce(sum, SumOp{});
    }
    if (lane != 0 || t[r] == s.ignore_index) continue;
    if (!is_valid(s, t[r])) {
      invalid = 1;
      continue;
    }
    double l = lse[r] - (1.0 - s.label_smoothing) * load(xr, t[r]);
    if (s.label_smoothing != 0.0f) l -= static_cast<double>(s.label_smoothing) / s.classes * sum;
    acc += l;
    ++n;
  }
  if (lane == 0) {
    total[warp] = acc;
    counted[warp] = n;
    bad[warp] = invalid;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kLossWarps; ++w) {
    acc += total[w];
    n += counted[w];
    invalid |= bad[w];
  }
  loss[0] = invalid ? nanf("") : n == 0 ? 0.0f : static_cast<float>(acc / static_cast<double>(n));
}

// dlogits_j = dloss / count * (p_j - q_j); ignored rows 0, invalid targets NaN.
// dloss is read on the device (the backward seed never visits the host).
template <typename T>
__global__ void xent_grad_kernel(XentShape s, const T* x, const int32_t* t, const float* lse,
                                 const float* dloss, T* dx) {
  int64_t counted = 0;
  for (int64_t base = 0; base < s.rows; base += blockDim.x) {
    const int64_t r = base + threadIdx.x;
    counted += __syncthreads_count(r < s.rows && t[r] != s.ignore_index);
  }
  const float g = counted == 0 ? 0.0f : *dloss / static_cast<float>(counted);
  const float off = s.label_smoothing / static_cast<float>(s.classes);
  const float on = 1.0f - s.label_smoothing + off;
  const int64_t r = blockIdx.x;
  const int32_t target = t[r];
  const bool ignored = target == s.ignore_index;
  const bool valid = is_valid(s, target);
  const T* xr = x + r * s.classes;
  for (int64_t j = threadIdx.x; j < s.classes; j += blockDim.x) {
    const float q = j == target ? on : off;
    const float v = ignored ? 0.0f : !valid ? nanf("") : g * (expf(load(xr, j) - lse[r]) - q);
    store(dx + r * s.classes, j, v);
  }
}

}  // namespace

void launch_softmax_forward(DType dtype, int64_t rows, int64_t cols, const void* x, void* y,
                            cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        cols, static_cast<const T*>(x), static_cast<T*>(y));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_softmax_backward(DType dtype, int64_t rows, int64_t cols, const void* y, const void* dy,
                             void* dx, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_grad_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        cols, static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_xent_forward(DType dtype, const XentShape& s, const void* logits,
                         const int32_t* targets, float* loss, float* lse, cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(logits);
    if (s.rows > 0) {
      lse_kernel<<<static_cast<unsigned>(s.rows), kRowThreads, 0, stream>>>(s.classes, x, lse);
      DTRAIN_CUDA_CHECK_LAUNCH();
    }
    loss_kernel<<<1, kLossWarps * 32, 0, stream>>>(s, x, targets, lse, loss);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_xent_backward(DType dtype, const XentShape& s, const void* logits,
                          const int32_t* targets, const float* lse, const float* dloss,
                          void* dlogits, cudaStream_t stream) {
  if (s.rows == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    xent_grad_kernel<<<static_cast<unsigned>(s.rows), kRowThreads, 0, stream>>>(
        s, static_cast<const T*>(logits), targets, lse, dloss, static_cast<T*>(dlogits));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
