// CUDA elementwise kernels: grid-stride loops, one element per iteration, f32
// maths on f32 / f16 / bf16 storage. bias_add_backward gives each channel one
// thread that sums in the CPU's order, so it is deterministic (and simple;
// a two-pass reduction is the faster form for very long columns).
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

template <typename T>
__global__ void binary_kernel(BinaryOp op, float alpha, const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float x = load(a, i), y = load(b, i);
    const float r = op == BinaryOp::add ? x + y : op == BinaryOp::mul ? x * y : y + alpha * x;
    store(out, i, r);
  }
}

template <typename T>
__global__ void scale_kernel(float alpha, const T* x, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) store(out, i, alpha * load(x, i));
}

template <typename T>
__global__ void fill_kernel(T* x, float value, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) store(x, i, value);
}

template <typename T>
__global__ void bias_add_kernel(const T* x, const T* bias, T* y, int64_t n, int64_t channels,
                                int64_t inner) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    store(y, i, load(x, i) + load(bias, (i / inner) % channels));
  }
}

template <typename T>
__global__ void bias_grad_kernel(const T* dy, T* dbias, int64_t outer, int64_t channels,
                                 int64_t inner) {
  for (int64_t c = thread_index(); c < channels; c += thread_stride()) {
    float acc = 0.0f;
    for (int64_t o = 0; o < outer; ++o) {
      const T* plane = dy + (o * channels + c) * inner;
      float s = 0.0f;
      for (int64_t i = 0; i < inner; ++i) s += load(plane, i);
      acc += s;
    }
    store(dbias, c, acc);
  }
}

template <typename T>
__global__ void scale_batches_kernel(T* c, int64_t batch, int64_t count, int64_t stride,
                                     float beta) {
  for (int64_t i = thread_index(); i < batch * count; i += thread_stride()) {
    const int64_t at = (i / count) * stride + i % count;
    store(c, at, beta == 0.0f ? 0.0f : beta * load(c, at));
  }
}

}  // namespace

void launch_binary(BinaryOp op, DType dtype, float alpha, const void* a, const void* b, void* out,
                   int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_kernel<<<grid_for(n), kThreads, 0, stream>>>(
        op, alpha, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_scale(DType dtype, float alpha, const void* x, void* out, int64_t n,
                  cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(alpha, static_cast<const T*>(x),
                                                       static_cast<T*>(out), n);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_fill(DType dtype, void* x, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(x), value, n);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_bias_add(DType dtype, const void* x, const void* bias, void* y, int64_t outer,
                     int64_t channels, int64_t inner, cudaStream_t stream) {
  const int64_t n = outer * channels * inner;
  if (n == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_add_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                          static_cast<const T*>(bias),
                                                          static_cast<T*>(y), n, channels, inner);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_bias_add_backward(DType dtype, const void* dy, void* dbias, int64_t outer,
                              int64_t channels, int64_t inner, cudaStream_t stream) {
  if (channels == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_grad_kernel<<<grid_for(channels), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<T*>(dbias), outer, channels, inner);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_scale_batches(DType dtype, void* c, int64_t batch, int64_t count, int64_t stride,
                          float beta, cudaStream_t stream) {
  if (batch * count == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_batches_kernel<<<grid_for(batch * count), kThreads, 0, stream>>>(
        static_cast<T*>(c), batch, count, stride, beta);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
