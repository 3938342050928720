// Argument checks shared by all kernel entry points. A mismatch here is a
// caller bug (graph construction validates user-facing shapes), so CHECK.
#include "kernels/common.h"

#include <string>

namespace dtrain::kernels {

void require_cpu(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (!t->device().is_cpu()) {
      throw Error(fmt::format("kernel {} has no {} implementation yet (tensor {})", op,
                              t->device().str(), t->str()),
                  "run this job with device: cpu");
    }
  }
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
