// CUDA activations, the formulas of kernels/cpu/activation.cpp with CUDA's
// accurate tanhf / erff / expf (within 2 ulp) instead of the CPU's polynomial
// approximations: one element per thread iteration, f32 maths.
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/launch.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ float forward_one(ActKind act, float x) {
  switch (act) {
    case ActKind::relu:  // std::max(x, 0) as on the CPU: NaN and -0 pass through
      return x < 0.0f ? 0.0f : x;
    case ActKind::gelu_tanh:
      return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluC * x * x * x)));
    case ActKind::gelu_erf:
      return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    case ActKind::tanh:
      return tanhf(x);
  }
  return 0.0f;
}

__device__ float derivative(ActKind act, float x) {
  switch (act) {
    case ActKind::relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case ActKind::gelu_tanh: {
      const float t = tanhf(kSqrt2OverPi * (x + kGeluC * x * x * x));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case ActKind::gelu_erf:
      return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
    case ActKind::tanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
  }
  return 0.0f;
}

template <typename T>
__global__ void forward_kernel(ActKind act, const T* x, T* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    store(y, i, forward_one(act, load(x, i)));
  }
}

// ReLU's gradient is a select, so dy passes through unchanged (0 for x <= 0 and NaN x).
template <typename T>
__global__ void backward_kernel(ActKind act, const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float xv = load(x, i), d = load(dy, i);
    store(dx, i, act == ActKind::relu ? (xv > 0.0f ? d : 0.0f) : d * derivative(act, xv));
  }
}

}  // namespace

void launch_activation_forward(ActKind act, DType dtype, const void* x, void* y, int64_t n,
                               cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(act, static_cast<const T*>(x),
                                                         static_cast<T*>(y), n);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_activation_backward(ActKind act, DType dtype, const void* x, const void* dy, void* dx,
                                int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(
        act, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
