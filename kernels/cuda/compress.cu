// CUDA kernels of gradient compression (kernels/compress.h), deterministic: no
// atomics, every sum in a fixed order.
//  - top-k: the magnitude keys radix-sorted in descending order with their indices
//    (CUB's DeviceRadixSort, stable: equal magnitudes keep the lower index first),
//    the first k indices sorted ascending, the values gathered. O(n) passes of a
//    radix sort rather than a selection; the CPU selects (same result).
//  - scatter-add: one launch per run of distinct indices, runs in order.
//  - sign pack: a thread per 32-entry word; a block per chunk for the scale, |x|
//    summed in f64 by a fixed strided split and a fixed shared-memory tree.
//  - orthonormalisation: one block per matrix, modified Gram-Schmidt column by
//    column, f64 dot products by the same fixed tree.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/compress.cuh"
#include "kernels/cuda/launch.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr int kBlockThreads = 256;  // a power of two (the trees below)
constexpr size_t kAlign = 256;      // CUB's temporary storage and each buffer

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

__global__ void magnitude_keys(const float* x, int64_t n, uint32_t* keys, int32_t* idx) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    keys[i] = __float_as_uint(x[i]) & 0x7fffffffu;  // |x|'s order, NaN above +inf
    idx[i] = static_cast<int32_t>(i);
  }
}

__global__ void gather_values(const float* x, const int32_t* idx, int64_t k, float* values) {
  for (int64_t j = thread_index(); j < k; j += thread_stride()) values[j] = x[idx[j]];
}

__global__ void scatter_add_run(const int32_t* idx, const float* val, int64_t lo, int64_t hi,
                                float* out, int64_t n) {
  for (int64_t j = lo + thread_index(); j < hi; j += thread_stride()) {
    const int32_t i = idx[j];
    if (i >= 0 && i < n) out[i] += val[j];
  }
}

__global__ void clear_entries(const int32_t* idx, int64_t m, float* x, int64_t n) {
  for (int64_t j = thread_index(); j < m; j += thread_stride()) {
    const int32_t i = idx[j];
    if (i >= 0 && i < n) x[i] = -0.0f;
  }
}

__global__ void pack_words(const float* x, int64_t n, uint32_t* words, int64_t nwords) {
  for (int64_t w = thread_index(); w < nwords; w += thread_stride()) {
    uint32_t bits = 0;
    for (int b = 0; b < 32; ++b) {
      const int64_t i = w * 32 + b;
      if (i < n && (!signbit(x[i]) || x[i] == 0.0f)) bits |= 1u << b;
    }
    words[w] = bits;
  }
}

// The sum of every thread's v over the block (fixed tree); every thread gets it.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlockThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double r = shared[0];
  __syncthreads();  // shared is reused by the next call
  return r;
}

__global__ void chunk_scales(const float* x, int64_t n, int64_t chunk, float* scales) {
  __shared__ double shared[kBlockThreads];
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kBlockThreads) s += fabs(double{x[i]});
  s = block_sum(s, shared);
  if (threadIdx.x == 0) scales[blockIdx.x] = static_cast<float>(s / static_cast<double>(hi - lo));
}

__global__ void unpack_signs(const uint32_t* words, const float* scales, int64_t n, int64_t chunk,
                             float* out, bool add) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float s = scales[i / chunk];
    const float v = ((words[i / 32] >> (i % 32)) & 1u) ? s : -s;
    out[i] = add ? out[i] + v : v;
  }
}

__global__ void orthonormalize(float* a, int64_t rows, int64_t cols) {
  __shared__ double shared[kBlockThreads];
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t q = 0; q < j; ++q) {
      double d = 0;
      for (int64_t i = threadIdx.x; i < rows; i += kBlockThreads)
        d += static_cast<double>(a[i * cols + j]) * a[i * cols + q];
      const double dot = block_sum(d, shared);
      for (int64_t i = threadIdx.x; i < rows; i += kBlockThreads)
        a[i * cols + j] -= static_cast<float>(dot * a[i * cols + q]);
    }
    double d = 0;
    for (int64_t i = threadIdx.x; i < rows; i += kBlockThreads)
      d += static_cast<double>(a[i * cols + j]) * a[i * cols + j];
    const double norm = sqrt(block_sum(d, shared));
    for (int64_t i = threadIdx.x; i < rows; i += kBlockThreads)
      a[i * cols + j] = norm > 1e-30 ? static_cast<float>(a[i * cols + j] / norm) : 0.0f;
    __syncthreads();
  }
}

// CUB's temporary bytes for both sorts of launch_topk at n entries.
size_t cub_bytes(int64_t n) {
  size_t pairs = 0, keys = 0;
  const int items = static_cast<int>(n);
  DTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, pairs, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items));
  DTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(
      nullptr, keys, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items));
  return pairs > keys ? pairs : keys;
}

}  // namespace

size_t topk_temp_bytes(int64_t n) {
  const size_t buf = aligned(static_cast<size_t>(n) * 4);
  return kAlign + 4 * buf + aligned(cub_bytes(n));
}

void launch_topk(const float* x, int64_t n, int64_t k, int32_t* indices, float* values,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  DTRAIN_CHECK(n <= INT32_MAX, "top-k of {} entries: at most 2^31 - 1 on CUDA", n);
  DTRAIN_CHECK(workspace_bytes >= topk_temp_bytes(n), "top-k workspace: {} bytes, {} needed",
               workspace_bytes, topk_temp_bytes(n));
  auto base = reinterpret_cast<uintptr_t>(workspace);
  base = (base + kAlign - 1) / kAlign * kAlign;
  const size_t buf = aligned(static_cast<size_t>(n) * 4);
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + buf);
  auto* idx_in = reinterpret_cast<int32_t*>(base + 2 * buf);
  auto* idx_out = reinterpret_cast<int32_t*>(base + 3 * buf);
  void* temp = reinterpret_cast<void*>(base + 4 * buf);
  size_t temp_bytes = cub_bytes(n);
  const int items = static_cast<int>(n);
  magnitude_keys<<<grid_for(n), kThreads, 0, stream>>>(x, n, keys_in, idx_in);
  DTRAIN_CUDA_CHECK_LAUNCH();
  DTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      temp, temp_bytes, keys_in, keys_out, idx_in, idx_out, items, 0, 32, stream));
  DTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, idx_out, indices,
                                                   static_cast<int>(k), 0, 32, stream));
  gather_values<<<grid_for(k), kThreads, 0, stream>>>(x, indices, k, values);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_scatter_add(const int32_t* indices, const float* values, int64_t m, int64_t segment,
                        float* out, int64_t n, cudaStream_t stream) {
  for (int64_t lo = 0; lo < m; lo += segment) {
    const int64_t hi = lo + segment < m ? lo + segment : m;
    scatter_add_run<<<grid_for(hi - lo), kThreads, 0, stream>>>(indices, values, lo, hi, out, n);
    DTRAIN_CUDA_CHECK_LAUNCH();
  }
}

void launch_clear_at(const int32_t* indices, int64_t m, float* x, int64_t n, cudaStream_t stream) {
  if (m == 0) return;
  clear_entries<<<grid_for(m), kThreads, 0, stream>>>(indices, m, x, n);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_sign_pack(const float* x, int64_t n, int64_t chunk, uint32_t* words, float* scales,
                      cudaStream_t stream) {
  if (n == 0) return;
  const int64_t nwords = (n + 31) / 32, nchunks = (n + chunk - 1) / chunk;
  pack_words<<<grid_for(nwords), kThreads, 0, stream>>>(x, n, words, nwords);
  DTRAIN_CUDA_CHECK_LAUNCH();
  DTRAIN_CHECK(nchunks <= INT32_MAX, "sign_pack: {} chunks", nchunks);
  chunk_scales<<<static_cast<unsigned>(nchunks), kBlockThreads, 0, stream>>>(x, n, chunk, scales);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_sign_unpack(const uint32_t* words, const float* scales, int64_t n, int64_t chunk,
                        float* out, bool add, cudaStream_t stream) {
  if (n == 0) return;
  unpack_signs<<<grid_for(n), kThreads, 0, stream>>>(words, scales, n, chunk, out, add);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_orthonormalize_columns(float* a, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  orthonormalize<<<1, kBlockThreads, 0, stream>>>(a, rows, cols);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace dtrain::kernels::cuda_ops
