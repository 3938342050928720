// Textbook fp64 embedding: out[i, :] = table[ids[i], :]; the gradient adds
// dout[i, :] into row ids[i], in position order.
#include "ref/embedding.h"

namespace dtrain::ref {

void embedding(int64_t n, int64_t dim, const double* ids, const double* table, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<int64_t>(ids[i]);
    for (int64_t k = 0; k < dim; ++k) out[i * dim + k] = table[row * dim + k];
  }
}

void embedding_backward(int64_t n, int64_t vocab, int64_t dim, const double* ids,
                        const double* dout, double* dtable) {
  for (int64_t v = 0; v < vocab * dim; ++v) dtable[v] = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<int64_t>(ids[i]);
    for (int64_t k = 0; k < dim; ++k) dtable[row * dim + k] += dout[i * dim + k];
  }
}

}  // namespace dtrain::ref
