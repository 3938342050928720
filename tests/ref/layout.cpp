// Reference permute, one element at a time through a multi-index.
#include "ref/layout.h"

#include <vector>

namespace dtrain::ref {

void permute(const Shape& x_shape, std::span<const int> perm, const double* x, double* y) {
  const int rank = x_shape.rank();
  std::vector<int64_t> stride(static_cast<size_t>(rank), 1);
  for (int i = rank - 2; i >= 0; --i) stride[i] = stride[i + 1] * x_shape[i + 1];
  std::vector<int64_t> idx(static_cast<size_t>(rank), 0);  // multi-index into y
  for (int64_t out = 0; out < x_shape.numel(); ++out) {
    int64_t src = 0;
    for (int k = 0; k < rank; ++k) src += idx[k] * stride[perm[k]];
    y[out] = x[src];
    for (int k = rank - 1; k >= 0; --k) {  // increment y's multi-index, last dim fastest
      if (++idx[k] < x_shape[perm[k]]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace dtrain::ref
