// Device-neutral memory entry points: host-only work here, anything touching
// a CUDA device goes to kernels/cuda_ops.h (real or stub, chosen at link time).
#include "kernels/memory.h"

#include <cstring>

#include "kernels/cuda_ops.h"

namespace dtrain::kernels {

Allocator& device_allocator(Device device) {
  if (device.is_cpu()) return host_allocator();
  return cuda_ops::allocator(device.index);
}

Allocator& pinned_host_allocator() { return cuda_ops::pinned_host_allocator(); }

void copy(const Tensor& src, Tensor& dst, CopySync sync) {
  DTRAIN_CHECK(src.defined() && dst.defined(), "copy: undefined tensor");
  DTRAIN_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
               "copy: {} into {} (dtype and element count must match)", src.str(), dst.str());
  if (src.nbytes() == 0) return;
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::memmove(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  cuda_ops::copy(src, dst, sync);
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda_ops::synchronize(device.index);
}

}  // namespace dtrain::kernels
