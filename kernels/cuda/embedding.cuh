// Host launchers of kernels/cuda/embedding.cu: the gather of table rows by id
// and its deterministic scatter-add (kernels/cpu/embedding.cpp's semantics).
// Ids stay on the device: an id outside [0, vocab) fills its output row with
// 0xFF bytes (NaN for float tables) and contributes nothing to dtable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

// ids i32/i64 [n], table [vocab, dim] (any dtype, elem_bytes 1/2/4/8) -> out [n, dim]
void launch_embedding_forward(DType id_type, const void* ids, int64_t n, const void* table,
                              int64_t vocab, int64_t dim, int64_t elem_bytes, void* out,
                              cudaStream_t stream);
// dout [n, dim] (dout_type) -> dtable [vocab, dim] (dtype: dout_type, or f32 for a half
// dout) += scattered rows (f32/f16/bf16)
void launch_embedding_backward(DType id_type, const void* ids, int64_t n, DType dout_type,
                               DType dtype, const void* dout, int64_t vocab, int64_t dim,
                               void* dtable, cudaStream_t stream);

// labels i32 [b, t] -> ids i32 [b * rows], out i32 [b, rows]: one thread per sequence
// scans its labels in order; positions past the rows-th labelled one are dropped.
void launch_labeled_rows(const int32_t* labels, int64_t b, int64_t t, int64_t rows,
                         int32_t ignore_index, int32_t* ids, int32_t* out, cudaStream_t stream);

// ids i32 [n] -> mask u8 [n]: 1 where ids[i] != pad_id.
void launch_padding_mask(const int32_t* ids, int64_t n, int32_t pad_id, uint8_t* mask,
                         cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
