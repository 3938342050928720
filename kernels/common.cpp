// Argument checks shared by all kernel entry points. A mismatch here is a
// caller bug (graph construction validates user-facing shapes), so CHECK.
#include "kernels/common.h"

#include <string>

namespace dtrain::kernels {

Device same_device(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
    } else if (t->device() != first->device()) {
      throw Error(fmt::format("kernel {}: tensors on different devices ({} and {})", op,
                              first->str(), t->str()),
                  "copy one of them with kernels::copy() first (kernels/memory.h)");
    }
  }
  return first != nullptr ? first->device() : Device::cpu();
}

void require_dtype(std::string_view op, std::string_view arg, const Tensor& t,
                   std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype() == d) return;
  }
  std::string names;
  for (DType d : allowed)
    names += std::string(names.empty() ? "" : ", ") + std::string(dtype_name(d));
  DTRAIN_CHECK(false, "{}: {} is {}, expected one of {}", op, arg, dtype_name(t.dtype()), names);
}

void require_numel(std::string_view op, std::string_view arg, const Tensor& t, int64_t numel) {
  DTRAIN_CHECK(t.defined() && t.numel() == numel, "{}: {} has {} elements ({}), expected {}", op,
               arg, t.defined() ? t.numel() : 0, t.defined() ? t.str() : "undefined", numel);
}

}  // namespace dtrain::kernels
