// What every kernel shares: the caller-provided workspace and argument checks.
// Kernels take dtype and workspace from the caller and never allocate. Public
// entry points in namespace dtrain::kernels are device-neutral: they check
// their tensors (device, dtype, size) and run the device's implementation.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"

namespace dtrain::kernels {

// How f32 products (GEMM, convolution) are computed. fp32: full-precision FMAs (the
// default, the same maths as the CPU). tf32: CUDA tensor cores with 10-bit mantissa
// inputs, only when the job sets precision.tf32; the CPU computes in f32 either way.
enum class MathMode : uint8_t { fp32, tf32 };

// Scratch memory owned by the caller. Kernels ask for it up front through a
// <family>_workspace_bytes() function and carve it with take<T>().
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::cpu();  // where `data` lives (for tensors wrapped around it)

  template <typename T>
  T* take(size_t& offset, size_t count) const {
    offset = (offset + 63) / 64 * 64;
    const size_t need = offset + count * sizeof(T);
    DTRAIN_CHECK(need <= bytes, "workspace too small: need {} bytes, have {}", need, bytes);
    T* p = reinterpret_cast<T*>(static_cast<char*>(data) + offset);
    offset = need;
    return p;
  }
  // The next shape.numel() elements as a tensor on this workspace's device.
  Tensor tensor(size_t& offset, const Shape& shape, DType dtype) const {
    const size_t n = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    return Tensor::wrap(take<std::byte>(offset, n), shape, dtype, device);
  }
  // Everything from `offset` on (for a kernel called with what is left).
  Workspace after(size_t offset) const {
    DTRAIN_CHECK(offset <= bytes, "workspace offset {} past its {} bytes", offset, bytes);
    return {static_cast<char*>(data) + offset, bytes - offset, device};
  }
};

// Dispatch. Every public entry point first calls same_device() (all defined
// tensor arguments on one device, else a dtrain::Error naming the op and both
// devices) and then routes: CPU tensors to the kernels/cpu code, CUDA tensors
// to the host launchers of kernels/cuda_ops.h, which link to kernels/cuda/*
// (built with CUDA) or to kernels/cuda_stub/cuda_ops.cpp (built without: every
// launcher throws "built without CUDA"). So no caller needs an #if.
Device same_device(std::string_view op, std::initializer_list<const Tensor*> tensors);
void require_dtype(std::string_view op, std::string_view arg, const Tensor& t,
                   std::initializer_list<DType> allowed);
void require_numel(std::string_view op, std::string_view arg, const Tensor& t, int64_t numel);

}  // namespace dtrain::kernels
