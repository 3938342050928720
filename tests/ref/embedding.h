// Reference embedding gather and scatter-add in fp64 (the spec for
// kernels/embedding.h). Ids arrive as doubles holding integers.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

// ids [n], table [vocab, dim] -> out [n, dim]
void embedding(int64_t n, int64_t dim, const double* ids, const double* table, double* out);
// dout [n, dim] -> dtable [vocab, dim] = sum over positions i with ids[i] = v of dout[i]
void embedding_backward(int64_t n, int64_t vocab, int64_t dim, const double* ids,
                        const double* dout, double* dtable);

}  // namespace dtrain::ref
