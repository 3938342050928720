// CUDA contexts: created once per device under a lock and never destroyed
// (destroying streams and handles during static destruction races the CUDA
// runtime's own teardown).
#include "kernels/cuda/context.h"

#include <map>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/device_info.h"

namespace dtrain::kernels::cuda_ops {

Context& Context::get(int device) {
  static std::mutex mu;
  static std::map<int, Context*> contexts;
  std::lock_guard lock(mu);
  auto it = contexts.find(device);
  if (it == contexts.end()) {
    const CudaInfo info = query_cuda();
    if (!info.available) {
      throw RunError(fmt::format("no CUDA device available ({})", info.reason),
                     "run with device: cpu, or on a machine with an NVIDIA GPU and driver");
    }
    if (device < 0 || device >= static_cast<int>(info.devices.size())) {
      throw RunError(fmt::format("cuda:{} does not exist: this machine has {} CUDA device(s)",
                                 device, info.devices.size()),
                     fmt::format("use cuda:0 .. cuda:{}", info.devices.size() - 1));
    }
    it = contexts.emplace(device, new Context(device)).first;
  }
  it->second->activate();
  return *it->second;
}

Context::Context(int device) : device_(device) {
  activate();
  DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking));
  DTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
  DTRAIN_CUBLAS_CHECK(cublasLtCreate(&lt_));
  DTRAIN_CUBLAS_CHECK(cublasCreate(&blas_));
  DTRAIN_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
}

cudnnHandle_t Context::cudnn() {
  std::call_once(cudnn_once_, [this] {
    activate();
    DTRAIN_CUDNN_CHECK(cudnnCreate(&cudnn_));
    DTRAIN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  });
  return cudnn_;
}

void Context::activate() const { DTRAIN_CUDA_CHECK(cudaSetDevice(device_)); }

void Context::synchronize() const { DTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace dtrain::kernels::cuda_ops
