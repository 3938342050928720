// Kernels of gradient compression (src/compress): exact top-k selection, the sparse
// sum of all-gathered (index, value) pairs, 1-bit sign packing with one scale per
// chunk, and the orthonormalisation of PowerSGD's small factor. f32 data, CPU
// (kernels/cpu/compress.cpp) and CUDA (kernels/cuda/compress.cu). Every result is a
// function of the input alone (fixed orders, no atomics), so every rank computes the
// same bits from the same data; the two backends agree on indices and bits exactly
// and on sums to rounding (they add in different orders). Checked against the fp64
// references of tests/ref/compress.h in the kernel table (family "compress").
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

// Magnitude order, shared by both backends: |x| compared as the bit pattern of x with
// its sign cleared, a total order (NaN above +inf, so a NaN is always selected and the
// loss scaler's overflow test still sees it); equal magnitudes by index, lower first.

// Workspace topk_select needs for an input of n elements on `device`.
size_t topk_workspace_bytes(int64_t n, Device device = Device::cpu());
// x f32 [n] -> the k = indices.numel() entries of largest magnitude (1 <= k <= n):
// indices i32 [k] ascending, values f32 [k] the entries there.
void topk_select(const Tensor& x, Tensor& indices, Tensor& values, Workspace ws);

// out f32 [n]: out[indices[j]] += values[j] for j = 0, 1, ... in that order. Indices
// are distinct within each run of `segment` consecutive pairs (one rank's top-k in an
// all-gather), so a backend may add a run at once; runs are added one after another.
void scatter_add(const Tensor& indices, const Tensor& values, int64_t segment, Tensor& out);
// x f32: x[indices[j]] = -0 for every j (top-k's residual: the sent entries taken out;
// -0 so that adding it later changes no value).
void clear_at(const Tensor& indices, Tensor& x);

// 1-bit: bit (i % 32) of words[i / 32] is 1 when x[i] >= 0 (+0 and -0 both count as
// +); scales[c] = the mean |x| over chunk c = [c * chunk, min(n, (c + 1) * chunk)),
// summed in f64. x f32 [n]; words i32 [ceil(n / 32)] (bit patterns; the unused high
// bits of the last word 0); scales f32 [ceil(n / chunk)].
void sign_pack(const Tensor& x, int64_t chunk, Tensor& words, Tensor& scales);
// out f32 [n]: (bit i ? +1 : -1) * scales[i / chunk], written (`add`: added to out).
void sign_unpack(const Tensor& words, const Tensor& scales, int64_t chunk, Tensor& out, bool add);

// a f32 [rows, cols], row-major: its columns made orthonormal in place, by modified
// Gram-Schmidt in column order with f64 dot products; a column whose norm after
// projection is <= 1e-30 is left zero.
void orthonormalize_columns(Tensor& a);

}  // namespace dtrain::kernels
