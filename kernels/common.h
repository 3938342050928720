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

// Scratch memory owned by the caller. Kernels ask for it up front through a
// <family>_workspace_bytes() function and carve it with take<T>().
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;

  template <typename T>
  T* take(size_t& offset, size_t count) const {
    offset = (offset + 63) / 64 * 64;
    const size_t need = offset + count * sizeof(T);
    DTRAIN_CHECK(need <= bytes, "workspace too small: need {} bytes, have {}", need, bytes);
    T* p = reinterpret_cast<T*>(static_cast<char*>(data) + offset);
    offset = need;
    return p;
  }
};

// The device every tensor argument of `op` must share (all CPU in this build
// of the kernel table; CUDA entry points arrive with the CUDA backend).
void require_cpu(std::string_view op, std::initializer_list<const Tensor*> tensors);
void require_dtype(std::string_view op, std::string_view arg, const Tensor& t,
                   std::initializer_list<DType> allowed);
void require_numel(std::string_view op, std::string_view arg, const Tensor& t, int64_t numel);

}  // namespace dtrain::kernels
