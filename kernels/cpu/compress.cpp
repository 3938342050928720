// See kernels/compress.h. CPU: top-k by partial selection (std::nth_element, O(n)
// expected) on the magnitude key, then the k indices sorted; the rest are plain loops
// in element order (one thread: these run on gradients already reduced to one bucket,
// and their order is what makes the bits reproducible).
#include "kernels/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/cuda_ops.h"

namespace dtrain::kernels {

namespace {

// |x| as an unsigned integer key: the order of magnitudes, NaN above +inf.
uint32_t magnitude_key(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

void require_f32(std::string_view op, std::string_view arg, const Tensor& t) {
  require_dtype(op, arg, t, {DType::f32});
}

}  // namespace

size_t topk_workspace_bytes(int64_t n, Device device) {
  if (device.is_cuda()) return cuda_ops::topk_workspace_bytes(n);
  return static_cast<size_t>(n) * sizeof(int32_t) + 64;  // + alignment slack
}

void topk_select(const Tensor& x, Tensor& indices, Tensor& values, Workspace ws) {
  const Device device = same_device("topk_select", {&x, &indices, &values});
  require_f32("topk_select", "x", x);
  require_dtype("topk_select", "indices", indices, {DType::i32});
  require_f32("topk_select", "values", values);
  const int64_t n = x.numel(), k = indices.numel();
  DTRAIN_CHECK(k >= 1 && k <= n, "topk_select: k = {} of {} elements", k, n);
  require_numel("topk_select", "values", values, k);
  if (device.is_cuda()) return cuda_ops::topk_select(x, indices, values, ws);
  const float* px = x.data<float>();
  size_t offset = 0;
  int32_t* order = ws.take<int32_t>(offset, static_cast<size_t>(n));
  std::iota(order, order + n, 0);
  auto before = [px](int32_t a, int32_t b) {
    const uint32_t ka = magnitude_key(px[a]), kb = magnitude_key(px[b]);
    return ka > kb || (ka == kb && a < b);
  };
  if (k < n) std::nth_element(order, order + k, order + n, before);
  std::sort(order, order + k);
  int32_t* idx = indices.data<int32_t>();
  float* val = values.data<float>();
  for (int64_t i = 0; i < k; ++i) {
    idx[i] = order[i];
    val[i] = px[order[i]];
  }
}

void scatter_add(const Tensor& indices, const Tensor& values, int64_t segment, Tensor& out) {
  const Device device = same_device("scatter_add", {&indices, &values, &out});
  require_dtype("scatter_add", "indices", indices, {DType::i32});
  require_f32("scatter_add", "values", values);
  require_f32("scatter_add", "out", out);
  require_numel("scatter_add", "values", values, indices.numel());
  DTRAIN_CHECK(segment >= 1, "scatter_add: segment {}", segment);
  if (device.is_cuda()) return cuda_ops::scatter_add(indices, values, segment, out);
  const int32_t* idx = indices.data<int32_t>();
  const float* val = values.data<float>();
  float* o = out.data<float>();
  const int64_t n = out.numel();
  for (int64_t j = 0; j < indices.numel(); ++j) {
    DTRAIN_CHECK(idx[j] >= 0 && idx[j] < n, "scatter_add: index {} at {} outside [0, {})", idx[j],
                 j, n);
    o[idx[j]] += val[j];
  }
}

void clear_at(const Tensor& indices, Tensor& x) {
  const Device device = same_device("clear_at", {&indices, &x});
  require_dtype("clear_at", "indices", indices, {DType::i32});
  require_f32("clear_at", "x", x);
  if (device.is_cuda()) return cuda_ops::clear_at(indices, x);
  const int32_t* idx = indices.data<int32_t>();
  float* p = x.data<float>();
  for (int64_t j = 0; j < indices.numel(); ++j) {
    DTRAIN_CHECK(idx[j] >= 0 && idx[j] < x.numel(), "clear_at: index {} at {} outside [0, {})",
                 idx[j], j, x.numel());
    p[idx[j]] = -0.0f;
  }
}

namespace {

void check_sign_args(std::string_view op, const Tensor& words, const Tensor& scales, int64_t n,
                     int64_t chunk) {
  DTRAIN_CHECK(chunk >= 1, "{}: chunk {}", op, chunk);
  require_dtype(op, "words", words, {DType::i32});
  require_f32(op, "scales", scales);
  require_numel(op, "words", words, (n + 31) / 32);
  require_numel(op, "scales", scales, (n + chunk - 1) / chunk);
}

}  // namespace

void sign_pack(const Tensor& x, int64_t chunk, Tensor& words, Tensor& scales) {
  const Device device = same_device("sign_pack", {&x, &words, &scales});
  require_f32("sign_pack", "x", x);
  const int64_t n = x.numel();
  check_sign_args("sign_pack", words, scales, n, chunk);
  if (device.is_cuda()) return cuda_ops::sign_pack(x, chunk, words, scales);
  const float* px = x.data<float>();
  auto* w = static_cast<uint32_t*>(words.raw());
  std::fill(w, w + words.numel(), 0u);
  for (int64_t i = 0; i < n; ++i)
    if (!std::signbit(px[i]) || px[i] == 0.0f) w[i / 32] |= 1u << (i % 32);
  float* s = scales.data<float>();
  for (int64_t c = 0; c * chunk < n; ++c) {
    const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
    double sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += std::fabs(px[i]);
    s[c] = static_cast<float>(sum / static_cast<double>(hi - lo));
  }
}

void sign_unpack(const Tensor& words, const Tensor& scales, int64_t chunk, Tensor& out, bool add) {
  const Device device = same_device("sign_unpack", {&words, &scales, &out});
  require_f32("sign_unpack", "out", out);
  const int64_t n = out.numel();
  check_sign_args("sign_unpack", words, scales, n, chunk);
  if (device.is_cuda()) return cuda_ops::sign_unpack(words, scales, chunk, out, add);
  const auto* w = static_cast<const uint32_t*>(words.raw());
  const float* s = scales.data<float>();
  float* o = out.data<float>();
  // Chunk by chunk, word by word: the scale and the word are loaded once.
  for (int64_t lo = 0; lo < n; lo += chunk) {
    const float scale = s[lo / chunk];
    const int64_t hi = std::min(n, lo + chunk);
    for (int64_t i = lo; i < hi; ++i) {
      const float v = ((w[i / 32] >> (i % 32)) & 1u) ? scale : -scale;
      o[i] = add ? o[i] + v : v;
    }
  }
}

void orthonormalize_columns(Tensor& a) {
  const Device device = same_device("orthonormalize_columns", {&a});
  require_f32("orthonormalize_columns", "a", a);
  DTRAIN_CHECK(a.shape().rank() == 2, "orthonormalize_columns: {} is not a matrix", a.str());
  if (device.is_cuda()) return cuda_ops::orthonormalize_columns(a);
  const int64_t rows = a.shape()[0], cols = a.shape()[1];
  float* p = a.data<float>();
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t q = 0; q < j; ++q) {  // remove the earlier (unit) columns' parts
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i)
        dot += static_cast<double>(p[i * cols + j]) * p[i * cols + q];
      for (int64_t i = 0; i < rows; ++i)
        p[i * cols + j] -= static_cast<float>(dot * p[i * cols + q]);
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i)
      norm += static_cast<double>(p[i * cols + j]) * p[i * cols + j];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < rows; ++i)
      p[i * cols + j] = norm > 1e-30 ? static_cast<float>(p[i * cols + j] / norm) : 0.0f;
  }
}

}  // namespace dtrain::kernels
