// CUDA whole-tensor reductions in two deterministic passes: one thread block
// per kReduceBlock elements folds its elements in double (each thread a fixed
// strided subset, then a fixed shared-memory tree) into partials[b]; one block
// then combines the partials in a fixed order and writes the f32 result. No
// atomics, so a result never changes between runs.
#include <cfloat>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr int kReduceThreads = 256;
constexpr int kFinishThreads = 1024;

__device__ double max_nan(double a, double b) { return (a > b || isnan(a)) ? a : b; }

__device__ double combine(ReduceKind op, double a, double b) {
  switch (op) {
    case ReduceKind::max_abs:
      return max_nan(a, b);
    case ReduceKind::has_inf_or_nan:
      return (a != 0.0 || b != 0.0) ? 1.0 : 0.0;
    default:
      return a + b;
  }
}

__device__ double element(ReduceKind op, double v) {
  switch (op) {
    case ReduceKind::l2_norm:
      return v * v;
    case ReduceKind::max_abs:
      return fabs(v);
    case ReduceKind::has_inf_or_nan:
      return fabs(v) <= DBL_MAX ? 0.0 : 1.0;  // false exactly for +-Inf and NaN
    default:
      return v;
  }
}

__device__ double load_f64(const double* p, int64_t i) { return p[i]; }
template <typename T>
__device__ double load_f64(const T* p, int64_t i) {
  return load(p, i);
}

// Tree over blockDim.x (a power of two) values in shared memory; thread 0 gets the result.
template <int kWidth>
__device__ double block_fold(ReduceKind op, double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kWidth / 2; s > 0; s /= 2) {
    if (threadIdx.x < s)
      shared[threadIdx.x] = combine(op, shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  return shared[0];
}

template <typename T>
__global__ void partial_kernel(ReduceKind op, const T* x, int64_t n, double* partials) {
  __shared__ double shared[kReduceThreads];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kReduceBlock;
  const int64_t end = begin + kReduceBlock < n ? begin + kReduceBlock : n;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kReduceThreads) {
    acc = combine(op, acc, element(op, load_f64(x, i)));
  }
  const double r = block_fold<kReduceThreads>(op, acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

// Thread t folds partials [t * per, (t + 1) * per) in order, then the tree.
__global__ void finish_kernel(ReduceKind op, const double* partials, int64_t blocks, int64_t n,
                              float* out) {
  __shared__ double shared[kFinishThreads];
  const int64_t per = (blocks + kFinishThreads - 1) / kFinishThreads;
  double acc = 0.0;
  for (int64_t b = threadIdx.x * per; b < (threadIdx.x + 1) * per && b < blocks; ++b) {
    acc = combine(op, acc, partials[b]);
  }
  double r = block_fold<kFinishThreads>(op, acc, shared);
  if (threadIdx.x != 0) return;
  if (op == ReduceKind::mean) r = n == 0 ? nan("") : r / static_cast<double>(n);
  if (op == ReduceKind::l2_norm) r = sqrt(r);
  out[0] = static_cast<float>(r);
}

template <typename Fn>
void dispatch_reduce(DType t, Fn&& fn) {
  if (t == DType::f64) return fn(Tag<double>{});
  dispatch_float(t, fn);
}

}  // namespace

void launch_reduce(ReduceKind op, DType dtype, const void* x, int64_t n, double* partials,
                   float* out, cudaStream_t stream) {
  const int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  if (blocks > 0) {
    dispatch_reduce(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      partial_kernel<<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(
          op, static_cast<const T*>(x), n, partials);
      DTRAIN_CUDA_CHECK_LAUNCH();
    });
  }
  finish_kernel<<<1, kFinishThreads, 0, stream>>>(op, partials, blocks, n, out);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace dtrain::kernels::cuda_ops
