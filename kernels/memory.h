// Device memory at the kernel layer: the allocator of each device, pinned host
// memory for data-loading buffers, explicit copies and synchronize. Nothing in
// dtrain copies between devices implicitly; every transfer is a copy() call,
// and on CUDA it runs on the backend's stream of the device involved.
#pragma once

#include "core/allocator.h"
#include "core/tensor.h"

namespace dtrain::kernels {

enum class CopySync : uint8_t {
  blocking,        // copy() returns when dst holds the data (any host memory is free to reuse)
  stream_ordered,  // enqueued on the CUDA stream, ordered with later kernels there; host
                   // memory involved must be pinned (pinned_host_allocator())
};

// cpu: host_allocator(). cuda:N: device N's caching pool (kernels/cuda/allocator.cpp).
Allocator& device_allocator(Device device);
// memory.pool: false: the device's allocator stops caching (host: exact sizes and
// frees straight back; CUDA: one cudaMalloc per request and cudaFree on release).
// Blocks allocated before keep the mode they were allocated in.
void set_pool_caching(Device device, bool on);
// Page-locked host memory (cudaHostAlloc) behind a size-class cache; it
// reports Device::cpu() because it is host memory. Needs CUDA built.
Allocator& pinned_host_allocator();

// dst = src, same dtype and element count, any pair of devices (host <-> host
// is a memcpy). Without CUDA built, a CUDA side throws "built without CUDA".
void copy(const Tensor& src, Tensor& dst, CopySync sync = CopySync::blocking);

// Host -> device copy on the device's upload stream (a second CUDA stream), so it
// runs while kernels already enqueued on the compute stream execute; the compute
// stream then waits for it (an event), so any kernel enqueued after this call sees
// dst's new contents. src must be pinned host memory. The caller guarantees that no
// queued kernel still reads dst and that src is left alone until the copy is done
// (double buffers and a synchronize per step do both: runtime/device_feed.h).
// dst on the CPU: a plain memcpy.
void upload(const Tensor& pinned_src, Tensor& dst);

// `t` itself when it is host memory; else a host copy (blocking, so it is complete).
Tensor to_host(const Tensor& t);

// Waits until the device's stream has finished all work; a no-op on the CPU.
void synchronize(Device device);

}  // namespace dtrain::kernels
