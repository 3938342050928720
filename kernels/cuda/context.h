// Per-device CUDA state owned by the backend: one non-blocking stream on which
// every dtrain kernel, GEMM and copy for that device runs (so work on one
// device is ordered without events), the cuBLASLt and cuBLAS handles bound to
// it, and a cuDNN handle created on first use; plus an upload stream and an
// event for host -> device batch copies that overlap compute (kernels::upload).
// Contexts live for the process.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <mutex>

#include "core/tensor.h"

namespace dtrain::kernels::cuda_ops {

class Context {
 public:
  // Device `device`'s context, created on first use. Throws RunError "no CUDA
  // device available (<CUDA's reason>)" when there is none, and names the
  // device count when `device` is out of range. Makes `device` current.
  static Context& get(int device);

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cudaStream_t upload_stream() const { return upload_stream_; }
  cudaEvent_t upload_done() const { return upload_done_; }
  cublasLtHandle_t lt() const { return lt_; }
  cublasHandle_t blas() const { return blas_; }
  cudnnHandle_t cudnn();

  void activate() const;     // cudaSetDevice(device) for the calling thread
  void synchronize() const;  // waits for this context's stream

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  explicit Context(int device);

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t upload_stream_ = nullptr;
  cudaEvent_t upload_done_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::once_flag cudnn_once_;
  cudnnHandle_t cudnn_ = nullptr;
};

// Shared by the Tensor wrappers (kernels/cuda/ops*.cpp): the backend stream of the
// tensor's device, and an f32 tensor's device pointer.
inline cudaStream_t stream_of(const Tensor& t) { return Context::get(t.device().index).stream(); }
inline float* f32(Tensor& t) { return static_cast<float*>(t.raw()); }
inline const float* f32(const Tensor& t) { return static_cast<const float*>(t.raw()); }

}  // namespace dtrain::kernels::cuda_ops
