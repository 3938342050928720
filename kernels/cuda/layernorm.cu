// CUDA layer normalisation. Forward and dx: one thread block per row (rows are
// independent; the row sums use block_reduce's fixed order), two passes over
// the row for mean and variance as on the CPU. dgamma/dbeta: one block per tile
// of 32 columns; thread (c, r) walks rows r, r + 16, ... of column c in order,
// then the 16 partials of a column are added in r order from shared memory.
// No atomics and no workspace, so the results are bit-identical run to run.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layernorm.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr int kRowThreads = 256;
constexpr int kTileCols = 32;  // dgamma/dbeta: columns per block (one warp wide)
constexpr int kTileRows = 16;  // dgamma/dbeta: row partials per column

template <typename T>
__global__ void forward_kernel(int64_t cols, float eps, const T* x, const float* gamma,
                               const float* beta, T* y, float* mean, float* rstd) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += load(xr, j);
  const float m = block_reduce(s, SumOp{}, 0.0f, shared) / static_cast<float>(cols);
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = load(xr, j) - m;
    ss += d * d;
  }
  const float var = block_reduce(ss, SumOp{}, 0.0f, shared) / static_cast<float>(cols);
  const float rs = 1.0f / sqrtf(var + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    store(y + r * cols, j, (load(xr, j) - m) * rs * load(gamma, j) + load(beta, j));
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
template <typename T>
__global__ void dx_kernel(int64_t cols, const T* x, const T* dy, const float* gamma,
                          const float* mean, const float* rstd, T* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const T* dr = dy + r * cols;
  const float m = mean[r], rs = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = load(dr, j) * load(gamma, j);
    sg += g;
    sgx += g * (load(xr, j) - m) * rs;
  }
  const float mg = block_reduce(sg, SumOp{}, 0.0f, shared) / static_cast<float>(cols);
  const float mgx = block_reduce(sgx, SumOp{}, 0.0f, shared) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (load(xr, j) - m) * rs;
    const float g = load(dr, j) * load(gamma, j);
    store(dx + r * cols, j, rs * (g - mg - xhat * mgx));
  }
}

// dgamma = sum_rows dy xhat, dbeta = sum_rows dy; block (kTileCols, kTileRows).
template <typename T>
__global__ void param_grad_kernel(int64_t rows, int64_t cols, const T* x, const T* dy,
                                  const float* mean, const float* rstd, float* dgamma,
                                  float* dbeta) {
  __shared__ float sg[kTileRows][kTileCols];
  __shared__ float sb[kTileRows][kTileCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  float ag = 0.0f, ab = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kTileRows) {
      const float d = load(dy + r * cols, c);
      ag += d * ((load(x + r * cols, c) - mean[r]) * rstd[r]);
      ab += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < kTileRows; ++k) {
    ag += sg[k][threadIdx.x];
    ab += sb[k][threadIdx.x];
  }
  dgamma[c] = ag;  // f32 for every dtype
  dbeta[c] = ab;
}

}  // namespace

void launch_layer_norm_forward(DType dtype, int64_t rows, int64_t cols, float eps, const void* x,
                               const float* gamma, const float* beta, void* y, float* mean,
                               float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        cols, eps, static_cast<const T*>(x), gamma, beta, static_cast<T*>(y), mean, rstd);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x,
                                const void* dy, const float* gamma, const float* mean,
                                const float* rstd, void* dx, float* dgamma, float* dbeta,
                                cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(x);
    const T* dyp = static_cast<const T*>(dy);
    if (rows > 0) {
      dx_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(cols, xp, dyp, gamma, mean,
                                                                         rstd, static_cast<T*>(dx));
      DTRAIN_CUDA_CHECK_LAUNCH();
    }
    const unsigned tiles = static_cast<unsigned>((cols + kTileCols - 1) / kTileCols);
    param_grad_kernel<<<tiles, dim3(kTileCols, kTileRows), 0, stream>>>(rows, cols, xp, dyp, mean,
                                                                        rstd, dgamma, dbeta);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
