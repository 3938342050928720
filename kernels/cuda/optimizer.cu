// CUDA fused optimizer steps: the CPU loops of kernels/cpu/optimizer.cpp with
// one element per thread iteration (grid-stride), parameters of any float dtype
// and an optional rounded copy (kernels/optimizer.h), the same f32 expressions
// (IEEE sqrtf and division; nvcc may fuse a multiply-add, so values can differ
// from the CPU's in the last bit).
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/optimizer.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

// P: the parameters' storage type; C: the copy's, or void for none.
template <typename C>
__device__ inline void store_copy(C* copy, int64_t i, float v) {
  if constexpr (!std::is_same_v<C, void>) store(copy, i, v);
}

template <typename P, typename C>
__global__ void sgd_kernel(SgdScalars k, P* p, const float* g, float* buf, C* copy, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    float pi = load(p, i);
    const float d = g[i] * k.gscale + k.wd * pi;
    if (k.momentum == 0) {
      pi -= k.lr * d;
    } else {
      const float b = k.mu * buf[i] + d;
      buf[i] = b;
      pi -= k.lr * (k.momentum == 2 ? d + k.mu * b : b);
    }
    store(p, i, pi);
    store_copy(copy, i, pi);
  }
}

template <typename P, typename C>
__global__ void adamw_kernel(AdamScalars k, P* p, const float* g, float* m, float* v, C* copy,
                             int64_t n) {
  const float step_size = k.lr / k.bc1;
  const float keep = 1.0f - k.lr * k.wd;
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float gi = g[i] * k.gscale;
    const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
    const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / k.sqrt_bc2 + k.eps;
    const float pi = load(p, i) * keep - step_size * (mi / denom);
    store(p, i, pi);
    store_copy(copy, i, pi);
  }
}

__global__ void ema_kernel(float rest, const float* p, float* ema, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) ema[i] += rest * (p[i] - ema[i]);
}

// Calls fn(P*, C*) with the parameter and copy pointers cast to their storage types
// (C = void when there is no copy).
template <typename Fn>
void dispatch_param_copy(DType p_dtype, void* p, DType copy_dtype, void* copy, Fn&& fn) {
  dispatch_float(p_dtype, [&](auto ptag) {
    using P = typename decltype(ptag)::type;
    if (copy == nullptr) return fn(static_cast<P*>(p), static_cast<void*>(nullptr));
    dispatch_float(copy_dtype, [&](auto ctag) {
      using C = typename decltype(ctag)::type;
      fn(static_cast<P*>(p), static_cast<C*>(copy));
    });
  });
}

__device__ inline float lamb_direction(const AdamScalars& k, float p, float m, float v, float wd) {
  return (m / k.bc1) / (sqrtf(v) / k.sqrt_bc2 + k.eps) + wd * p;
}

// Block c: chunk c. Each thread sums its elements in double; the block folds the
// per-thread sums in a fixed order (block_reduce), so the bits never depend on timing.
__global__ void lamb_moments_kernel(AdamScalars k, const int64_t* ranges, const float* wd,
                                    const float* p, const float* g, float* m, float* v,
                                    double* sums) {
  __shared__ double shared[32];
  const int64_t c = blockIdx.x;
  const int64_t begin = ranges[2 * c], end = ranges[2 * c + 1];
  const float w = wd[c];
  double ps = 0, us = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = g[i] * k.gscale;
    const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
    const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i];
    const float u = lamb_direction(k, pi, mi, vi, w);
    ps += static_cast<double>(pi) * pi;
    us += static_cast<double>(u) * u;
  }
  ps = block_reduce(ps, SumOp{}, 0.0, shared);
  us = block_reduce(us, SumOp{}, 0.0, shared);
  if (threadIdx.x == 0) {
    sums[2 * c] = ps;
    sums[2 * c + 1] = us;
  }
}

__global__ void lamb_update_kernel(AdamScalars k, const int64_t* ranges, const float* wd,
                                   const float* step, float* p, const float* m, const float* v) {
  const int64_t c = blockIdx.x;
  const int64_t begin = ranges[2 * c], end = ranges[2 * c + 1];
  const float w = wd[c], s = step[c];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    p[i] -= s * lamb_direction(k, p[i], m[i], v[i], w);
}

}  // namespace

void launch_sgd_step(const SgdScalars& k, DType p_dtype, void* p, const float* g, float* momentum,
                     DType copy_dtype, void* copy, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_param_copy(p_dtype, p, copy_dtype, copy, [&](auto* pp, auto* cp) {
    sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(k, pp, g, momentum, cp, n);
  });
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_adamw_step(const AdamScalars& k, DType p_dtype, void* p, const float* g, float* m,
                       float* v, DType copy_dtype, void* copy, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_param_copy(p_dtype, p, copy_dtype, copy, [&](auto* pp, auto* cp) {
    adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(k, pp, g, m, v, cp, n);
  });
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_ema_update(float rest, const float* p, float* ema, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  ema_kernel<<<grid_for(n), kThreads, 0, stream>>>(rest, p, ema, n);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_lamb_moments(const AdamScalars& k, const int64_t* ranges, const float* wd,
                         int64_t chunks, const float* p, const float* g, float* m, float* v,
                         double* sums, cudaStream_t stream) {
  if (chunks == 0) return;
  lamb_moments_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(k, ranges, wd, p, g,
                                                                              m, v, sums);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_lamb_update(const AdamScalars& k, const int64_t* ranges, const float* wd,
                        const float* step, int64_t chunks, float* p, const float* m, const float* v,
                        cudaStream_t stream) {
  if (chunks == 0) return;
  lamb_update_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(k, ranges, wd, step, p,
                                                                             m, v);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace dtrain::kernels::cuda_ops
