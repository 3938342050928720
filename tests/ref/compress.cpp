// See compress.h. Written for clarity: a full sort for top-k, bit tests one at a time.
#include "ref/compress.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dtrain::ref {

void topk(const double* x, int64_t n, int64_t k, double* indices, double* values) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [x](int64_t a, int64_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  for (int64_t j = 0; j < k; ++j) {
    indices[j] = static_cast<double>(order[static_cast<size_t>(j)]);
    values[j] = x[order[static_cast<size_t>(j)]];
  }
}

void scatter_add(const double* base, int64_t n, const double* indices, const double* values,
                 int64_t m, double* out) {
  std::copy(base, base + n, out);
  for (int64_t j = 0; j < m; ++j) out[static_cast<int64_t>(indices[j])] += values[j];
}

void clear_at(const double* x, int64_t n, const double* indices, int64_t m, double* out) {
  std::copy(x, x + n, out);
  for (int64_t j = 0; j < m; ++j) out[static_cast<int64_t>(indices[j])] = 0.0;
}

void sign_pack(const double* x, int64_t n, int64_t chunk, double* words, double* scales) {
  for (int64_t w = 0; w * 32 < n; ++w) {
    uint32_t bits = 0;
    for (int64_t b = 0; b < 32 && w * 32 + b < n; ++b)
      if (x[w * 32 + b] >= 0.0) bits |= uint32_t{1} << b;
    words[w] = static_cast<double>(static_cast<int32_t>(bits));
  }
  for (int64_t c = 0; c * chunk < n; ++c) {
    const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
    double s = 0;
    for (int64_t i = lo; i < hi; ++i) s += std::fabs(x[i]);
    scales[c] = s / static_cast<double>(hi - lo);
  }
}

void sign_unpack(const double* words, const double* scales, int64_t n, int64_t chunk,
                 const double* base, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    const auto w = static_cast<uint32_t>(static_cast<int32_t>(words[i / 32]));
    const double v = ((w >> (i % 32)) & 1u) ? scales[i / chunk] : -scales[i / chunk];
    out[i] = (base ? base[i] : 0.0) + v;
  }
}

void orthonormalize_columns(const double* a, int64_t rows, int64_t cols, double* out) {
  std::copy(a, a + rows * cols, out);
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t q = 0; q < j; ++q) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += out[i * cols + j] * out[i * cols + q];
      for (int64_t i = 0; i < rows; ++i) out[i * cols + j] -= dot * out[i * cols + q];
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += out[i * cols + j] * out[i * cols + j];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < rows; ++i)
      out[i * cols + j] = norm > 1e-30 ? out[i * cols + j] / norm : 0.0;
  }
}

}  // namespace dtrain::ref
