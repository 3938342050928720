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
// dout [n, dim] -> dtable [vocab, dim] += scattered rows (caller zeroes dtable first);
// dtable in dout's dtype, or f32 for a half dout (a half table's gradient kept in f32)
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);

// Tensor parallelism (a vocabulary-parallel embedding; CPU only): `table` holds rows
// [first, first + table rows) of a vocabulary of `total`. An id of another rank's rows
// gives a zero row in forward and adds nothing in backward; an id outside [0, total)
// is an Error as above.
void embedding_forward_share(const Tensor& ids, const Tensor& table, int64_t first, int64_t total,
                             Tensor& out);
void embedding_backward_share(const Tensor& ids, const Tensor& dout, int64_t first, int64_t total,
                              Tensor& dtable);

// The ids for gathering the labelled positions of each sequence (a masked-LM head):
// labels i32 [B, T] (ignore_index: not predicted) -> ids i32 [B * R], the flat
// positions b * T + j of sequence b's first R labelled tokens in order (padding: b * T),
// and out i32 [B, R], their labels (padding: ignore_index); R = out.dim(1). More than R
// labelled positions in a sequence is an Error on the CPU; on CUDA (labels are not
// copied to the host) the positions past the R-th are not predicted.
void labeled_rows(const Tensor& labels, int64_t ignore_index, Tensor& ids, Tensor& out);

// The key-padding mask of a batch of token ids: ids i32 [B, T] -> mask u8 [B, T], 1 where
// the id is not pad_id (attend), 0 where it is (padding). A pad_id outside the
// vocabulary (-1) masks nothing.
void padding_mask(const Tensor& ids, int32_t pad_id, Tensor& mask);

}  // namespace dtrain::kernels
