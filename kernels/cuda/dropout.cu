// CUDA inverted dropout. Each thread step draws one Philox block (four words)
// and decides the up-to-four elements whose words live in it: word w = offset
// + i is lane w % 4 of block w / 4, so an offset that is not a multiple of 4
// is handled by the first and last blocks covering only part of [0, n).
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/philox.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

template <typename T>
__global__ void forward_kernel(DropoutDraw d, float scale, const T* x, int64_t n, T* y,
                               uint8_t* mask) {
  const uint64_t first = d.offset / 4, last = (d.offset + static_cast<uint64_t>(n) - 1) / 4;
  const int64_t blocks = static_cast<int64_t>(last - first + 1);
  for (int64_t b = thread_index(); b < blocks; b += thread_stride()) {
    const uint64_t blk = first + static_cast<uint64_t>(b);
    const philox::Words w = philox::block(d.seed, d.stream, blk);
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t word = blk * 4 + lane;
      if (word < d.offset) continue;
      const int64_t i = static_cast<int64_t>(word - d.offset);
      if (i >= n) break;
      const bool keep = philox::u32_to_uniform(w.w[lane]) >= d.p;
      mask[i] = keep ? 1 : 0;
      store(y, i, keep ? load(x, i) * scale : 0.0f);
    }
  }
}

template <typename T>
__global__ void backward_kernel(float scale, const T* dy, const uint8_t* mask, int64_t n, T* dx) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    store(dx, i, mask[i] ? load(dy, i) * scale : 0.0f);
  }
}

}  // namespace

void launch_dropout_forward(DType dtype, const DropoutDraw& d, const void* x, int64_t n, void* y,
                            uint8_t* mask, cudaStream_t stream) {
  if (n == 0) return;
  const float scale = 1.0f / (1.0f - d.p);
  const int64_t blocks =
      static_cast<int64_t>((d.offset + static_cast<uint64_t>(n) - 1) / 4 - d.offset / 4 + 1);
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(d, scale, static_cast<const T*>(x), n,
                                                              static_cast<T*>(y), mask);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_dropout_backward(DType dtype, float p, const void* dy, const uint8_t* mask, int64_t n,
                             void* dx, cudaStream_t stream) {
  if (n == 0) return;
  const float scale = 1.0f / (1.0f - p);
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(scale, static_cast<const T*>(dy), mask, n,
                                                          static_cast<T*>(dx));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
