// CUDA batch normalisation: one block per channel. Each thread sums a fixed
// stride of the channel's N*HW elements in f32, the block adds the thread sums
// in double through a fixed tree, so every statistic is bit-identical run to
// run (no atomics); then the block applies the affine map. Moments are two
// passes (mean, then squared deviations), as on the CPU. One block per channel
// keeps this simple; wide layers with few channels leave SMs idle (a split
// reduction over the caller's workspace is the next step when it matters).
#include <cmath>

#include "kernels/cuda/batchnorm.cuh"
#include "kernels/cuda/launch.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr int kBnThreads = 512;

// Sum of every thread's `v` over the block, in double, the same tree every run;
// the result is returned to all threads. `scratch` holds kBnThreads doubles.
__device__ double block_sum(double v, double* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int width = kBnThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) scratch[threadIdx.x] += scratch[threadIdx.x + width];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();
  return total;
}

// Element e of channel c: n = e / hw, i = e % hw.
__device__ int64_t at(const BnShape& s, int64_t c, int64_t e) {
  return ((e / s.hw) * s.c + c) * s.hw + e % s.hw;
}

template <typename T>
__global__ void forward_train_kernel(BnShape s, const T* x, const float* gamma, const float* beta,
                                     T* y, float* run_mean, float* run_var, float* save_mean,
                                     float* save_invstd) {
  __shared__ double scratch[kBnThreads];
  const int64_t c = blockIdx.x, m = s.n * s.hw;
  float part = 0.0f;
  for (int64_t e = threadIdx.x; e < m; e += kBnThreads) part += load(x, at(s, c, e));
  const double mean_d = block_sum(part, scratch) / static_cast<double>(m);
  const float mean = static_cast<float>(mean_d);
  part = 0.0f;
  for (int64_t e = threadIdx.x; e < m; e += kBnThreads) {
    const float d = load(x, at(s, c, e)) - mean;
    part += d * d;
  }
  const double var = block_sum(part, scratch) / static_cast<double>(m);
  const double invstd = 1.0 / sqrt(var + s.eps);
  const float scale = static_cast<float>(gamma[c] * invstd);
  const float shift = static_cast<float>(beta[c] - mean_d * gamma[c] * invstd);
  for (int64_t e = threadIdx.x; e < m; e += kBnThreads) {
    const int64_t i = at(s, c, e);
    store(y, i, load(x, i) * scale + shift);
  }
  if (threadIdx.x == 0) {
    const double md = static_cast<double>(m);
    const double unbiased = m > 1 ? var * md / (md - 1) : var;
    run_mean[c] = static_cast<float>((1.0 - s.momentum) * run_mean[c] + s.momentum * mean_d);
    run_var[c] = static_cast<float>((1.0 - s.momentum) * run_var[c] + s.momentum * unbiased);
    save_mean[c] = mean;
    save_invstd[c] = static_cast<float>(invstd);
  }
}

template <typename T>
__global__ void forward_infer_kernel(BnShape s, const T* x, const float* gamma, const float* beta,
                                     const float* run_mean, const float* run_var, T* y) {
  const int64_t total = s.n * s.c * s.hw;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t c = (i / s.hw) % s.c;
    const double invstd = 1.0 / sqrt(static_cast<double>(run_var[c]) + s.eps);
    const float scale = static_cast<float>(gamma[c] * invstd);
    const float shift = static_cast<float>(beta[c] - run_mean[c] * gamma[c] * invstd);
    store(y, i, load(x, i) * scale + shift);
  }
}

// dx = gamma * invstd * (dy - sum(dy)/M - xhat * sum(dy * xhat)/M), xhat = (x - mean) * invstd
template <typename T>
__global__ void backward_kernel(BnShape s, const T* x, const T* dy, const float* gamma,
                                const float* mean, const float* invstd, T* dx, float* dgamma,
                                float* dbeta) {
  __shared__ double scratch[kBnThreads];
  const int64_t c = blockIdx.x, m = s.n * s.hw;
  const float mu = mean[c], is = invstd[c];
  float p0 = 0.0f, p1 = 0.0f;
  for (int64_t e = threadIdx.x; e < m; e += kBnThreads) {
    const int64_t i = at(s, c, e);
    const float g = load(dy, i);
    p0 += g;
    p1 += g * (load(x, i) - mu) * is;
  }
  const double sum_dy = block_sum(p0, scratch);
  const double sum_dy_xhat = block_sum(p1, scratch);
  if (threadIdx.x == 0) {
    dbeta[c] = static_cast<float>(sum_dy);
    dgamma[c] = static_cast<float>(sum_dy_xhat);
  }
  const float k = gamma[c] * is, mean_dy = static_cast<float>(sum_dy / static_cast<double>(m));
  const float mean_dy_xhat = static_cast<float>(sum_dy_xhat / static_cast<double>(m));
  for (int64_t e = threadIdx.x; e < m; e += kBnThreads) {
    const int64_t i = at(s, c, e);
    store(dx, i, k * (load(dy, i) - mean_dy - (load(x, i) - mu) * is * mean_dy_xhat));
  }
}

}  // namespace

void launch_batch_norm_forward_train(DType dtype, const BnShape& s, const void* x,
                                     const float* gamma, const float* beta, void* y,
                                     float* running_mean, float* running_var, float* save_mean,
                                     float* save_invstd, cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_train_kernel<T><<<static_cast<unsigned>(s.c), kBnThreads, 0, stream>>>(
        s, static_cast<const T*>(x), gamma, beta, static_cast<T*>(y), running_mean, running_var,
        save_mean, save_invstd);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_batch_norm_forward_infer(DType dtype, const BnShape& s, const void* x,
                                     const float* gamma, const float* beta,
                                     const float* running_mean, const float* running_var, void* y,
                                     cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_infer_kernel<T><<<grid_for(s.n * s.c * s.hw), kThreads, 0, stream>>>(
        s, static_cast<const T*>(x), gamma, beta, running_mean, running_var, static_cast<T*>(y));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_batch_norm_backward(DType dtype, const BnShape& s, const void* x, const void* dy,
                                const float* gamma, const float* save_mean,
                                const float* save_invstd, void* dx, float* dgamma, float* dbeta,
                                cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<T><<<static_cast<unsigned>(s.c), kBnThreads, 0, stream>>>(
        s, static_cast<const T*>(x), static_cast<const T*>(dy), gamma, save_mean, save_invstd,
        static_cast<T*>(dx), dgamma, dbeta);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
