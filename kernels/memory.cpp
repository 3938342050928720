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

void set_pool_caching(Device device, bool on) {
  if (device.is_cpu()) {
    host_allocator().set_caching(on);
  } else {
    cuda_ops::set_pool_caching(device.index, on);
  }
}

Allocator& pinned_host_allocator() { return cuda_ops::pinned_host_allocator(); }

void copy(const Tensor& src, Tensor& dst, CopySync sync) {
  DTRAIN_CHECK(src.defined() && dst.defined(), "copy: undefined tensor");
  DTRAIN_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
               "copy: {} into {} (dtype and element count must match)", src.str(), dst.str());
  if (src.nbytes() == 0 || src.raw() == dst.raw()) return;  // nothing to move
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::memmove(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  cuda_ops::copy(src, dst, sync);
}

void upload(const Tensor& pinned_src, Tensor& dst) {
  DTRAIN_CHECK(pinned_src.defined() && dst.defined() && pinned_src.device().is_cpu(),
               "upload: {} -> {} (the source must be host memory)",
               pinned_src.defined() ? pinned_src.str() : "undefined",
               dst.defined() ? dst.str() : "undefined");
  if (dst.device().is_cpu()) return copy(pinned_src, dst);
  DTRAIN_CHECK(pinned_src.dtype() == dst.dtype() && pinned_src.numel() == dst.numel(),
               "upload: {} into {} (dtype and element count must match)", pinned_src.str(),
               dst.str());
  if (dst.nbytes() == 0) return;
  cuda_ops::upload(pinned_src, dst);
}

Tensor to_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  copy(t, h);
  return h;
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda_ops::synchronize(device.index);
}

}  // namespace dtrain::kernels
