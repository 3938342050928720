// CUDA device discovery through the runtime API only (no -lcuda, so the binary
// starts on machines without a driver). cuDNN and NCCL report their versions.
#include <cudnn.h>
#include <nccl.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/device_info.h"

namespace dtrain::kernels {

CudaInfo query_cuda() {
  CudaInfo info;
  info.built = true;
  info.cudnn_version = static_cast<int>(cudnnGetVersion());
  if (ncclGetVersion(&info.nccl_version) != ncclSuccess) info.nccl_version = 0;
  if (cudaRuntimeGetVersion(&info.runtime_version) != cudaSuccess) info.runtime_version = 0;
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.reason = fmt::format("{}, CUDA error {}", cudaGetErrorString(err), static_cast<int>(err));
    cudaGetLastError();  // clear the sticky error so later calls report their own
    return info;
  }
  if (count == 0) {
    info.reason = "the CUDA runtime found 0 devices";
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    DTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
    // NVML's form of the PCI address ("domain:bus:device.function", hex): how
    // runtime/monitor.cpp finds this device there whatever CUDA_VISIBLE_DEVICES says.
    const std::string pci =
        fmt::format("{:08X}:{:02X}:{:02X}.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    info.devices.push_back(
        {i, p.name, p.totalGlobalMem, p.major, p.minor, p.multiProcessorCount, pci});
  }
  info.available = true;
  return info;
}

}  // namespace dtrain::kernels
