// Embedding lookup (gather of table rows by id) and its backward (scatter-add
// into the table gradient, deterministic: each table row is owned by one thread
// and rows are accumulated in id order). An id outside [0, vocab) is an Error on
// the CPU; on CUDA (ids are not copied to the host) its output row is NaN and it
// adds nothing to dtable.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

// ids i32 or i64 [n], table [vocab, dim] -> out [n, dim]
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
// dout [n, dim] -> dtable [vocab, dim] += scattered rows (caller zeroes dtable first)
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);

}  // namespace dtrain::kernels
