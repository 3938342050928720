// Host kernels of gradient compression (src/compress): exact top-k selection, 1-bit
// sign packing with one scale per chunk, and the orthonormalisation of PowerSGD's
// small factor. Plain f32 arrays on the host (the CPU backend; CUDA versions are
// not built yet). Every result is a function of the input alone (no threads, fixed
// order), so every rank computes the same bits from the same data.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

// The k entries of x[0, n) with the largest magnitude, ties to the lower index
// (exact, by partial selection: O(n) expected); `indices` ascending, `values` the
// entries there. 0 <= k <= n.
void topk_select(const float* x, int64_t n, int64_t k, int32_t* indices, float* values);

// 1-bit: bit (i % 32) of words[i / 32] is 1 when x[i] >= 0 (so +0 and -0 give +);
// scales[c] = the mean |x| over chunk c = [c * chunk, min(n, (c + 1) * chunk)).
// words: ceil(n / 32), scales: ceil(n / chunk); unused high bits of the last word 0.
void sign_pack(const float* x, int64_t n, int64_t chunk, uint32_t* words, float* scales);
// out[i] = (bit i ? +1 : -1) * scales[i / chunk] (overwritten; `add`: added to out).
void sign_unpack(const uint32_t* words, const float* scales, int64_t n, int64_t chunk, float* out,
                 bool add);

// The columns of a row-major [rows, cols] matrix made orthonormal in place, modified
// Gram-Schmidt in column order in f64 accumulation; a column that vanishes (norm <=
// 1e-30 after projection) is left zero. rows >= cols is not required.
void orthonormalize_columns(float* a, int64_t rows, int64_t cols);

}  // namespace dtrain::kernels
