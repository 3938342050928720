// See kernels/compress.h.
#include "kernels/compress.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dtrain::kernels {

void topk_select(const float* x, int64_t n, int64_t k, int32_t* indices, float* values) {
  if (k <= 0) return;
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Larger magnitude first; equal magnitudes by index, so the selection is unique.
  auto before = [x](int32_t a, int32_t b) {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa > fb || (fa == fb && a < b);
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  std::sort(order.begin(), order.begin() + k);
  for (int64_t i = 0; i < k; ++i) {
    indices[i] = order[static_cast<size_t>(i)];
    values[i] = x[order[static_cast<size_t>(i)]];
  }
}

void sign_pack(const float* x, int64_t n, int64_t chunk, uint32_t* words, float* scales) {
  const int64_t nwords = (n + 31) / 32;
  std::fill(words, words + nwords, 0u);
  for (int64_t i = 0; i < n; ++i)
    if (!std::signbit(x[i]) || x[i] == 0.0f) words[i / 32] |= 1u << (i % 32);
  for (int64_t c = 0; c * chunk < n; ++c) {
    const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
    double sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += std::fabs(x[i]);
    scales[c] = static_cast<float>(sum / static_cast<double>(hi - lo));
  }
}

void sign_unpack(const uint32_t* words, const float* scales, int64_t n, int64_t chunk, float* out,
                 bool add) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = scales[i / chunk];
    const float v = ((words[i / 32] >> (i % 32)) & 1u) ? s : -s;
    out[i] = add ? out[i] + v : v;
  }
}

void orthonormalize_columns(float* a, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t p = 0; p < j; ++p) {  // remove the earlier (unit) columns' parts
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i)
        dot += static_cast<double>(a[i * cols + j]) * a[i * cols + p];
      for (int64_t i = 0; i < rows; ++i)
        a[i * cols + j] -= static_cast<float>(dot * a[i * cols + p]);
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i)
      norm += static_cast<double>(a[i * cols + j]) * a[i * cols + j];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < rows; ++i)
      a[i * cols + j] = norm > 1e-30 ? static_cast<float>(a[i * cols + j] / norm) : 0.0f;
  }
}

}  // namespace dtrain::kernels
