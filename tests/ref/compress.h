// Reference gradient-compression kernels in fp64 (the spec for kernels/compress.h).
// Integers (indices, sign words as int32 bit patterns) arrive and leave as doubles.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

// The k entries of x[0, n) of largest |x|, ties to the lower index: indices
// ascending, values the entries there.
void topk(const double* x, int64_t n, int64_t k, double* indices, double* values);
// out[n] = base + sum over j (in order) of values[j] at indices[j].
void scatter_add(const double* base, int64_t n, const double* indices, const double* values,
                 int64_t m, double* out);
// out[n] = x with the entries at indices set to 0.
void clear_at(const double* x, int64_t n, const double* indices, int64_t m, double* out);
// words[ceil(n / 32)]: bit i % 32 of word i / 32 set when x[i] >= 0 (as int32 values);
// scales[ceil(n / chunk)]: the mean |x| of each chunk.
void sign_pack(const double* x, int64_t n, int64_t chunk, double* words, double* scales);
// out[n] = (bit i ? 1 : -1) * scales[i / chunk], plus base[i] when base is not null.
void sign_unpack(const double* words, const double* scales, int64_t n, int64_t chunk,
                 const double* base, double* out);
// out [rows, cols] = a's columns orthonormalised by modified Gram-Schmidt (a column
// whose norm after projection is <= 1e-30 becomes zero).
void orthonormalize_columns(const double* a, int64_t rows, int64_t cols, double* out);

}  // namespace dtrain::ref
