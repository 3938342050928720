// CUDA permute: one output element per thread iteration, its source offset
// decoded from the output index through the permuted strides. Consecutive
// threads write consecutive outputs (coalesced stores); loads are strided.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layout.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

template <typename T>
__global__ void permute_kernel(PermuteGeometry g, const T* x, T* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    int64_t rem = i, off = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      off += (rem % g.out_dim[d]) * g.src_stride[d];
      rem /= g.out_dim[d];
    }
    y[i] = x[off];
  }
}

template <typename T>
void launch_typed(const PermuteGeometry& g, const void* x, void* y, int64_t n,
                  cudaStream_t stream) {
  permute_kernel<<<grid_for(n), kThreads, 0, stream>>>(g, static_cast<const T*>(x),
                                                       static_cast<T*>(y), n);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_permute(const PermuteGeometry& g, size_t elem_bytes, const void* x, void* y, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  switch (elem_bytes) {
    case 1:
      return launch_typed<uint8_t>(g, x, y, n, stream);
    case 2:
      return launch_typed<uint16_t>(g, x, y, n, stream);
    case 4:
      return launch_typed<uint32_t>(g, x, y, n, stream);
    case 8:
      return launch_typed<uint64_t>(g, x, y, n, stream);
    default:
      throw ::dtrain::Error(::fmt::format("CUDA permute: no {}-byte element type", elem_bytes));
  }
}

}  // namespace dtrain::kernels::cuda_ops
