// CPU inverted dropout: element i is kept iff Philox(seed, stream).uniform(offset + i)
// >= p, and kept values are scaled by 1/(1-p) (in f32). Philox blocks give four
// words each, so a chunk draws one block per four elements. The mask (u8, 1 = kept)
// is saved for backward; element decisions are independent, so results do not
// depend on the thread count. f32/f16/bf16 storage. CUDA tensors go to
// kernels/cuda/dropout.cu, which draws the same Philox words (same mask).
#include <algorithm>

#include "core/parallel.h"
#include "core/rng.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/dropout.h"

namespace dtrain::kernels {

namespace {

using cpu_io::kBlock;

constexpr int64_t kGrain = int64_t{1} << 14;

// mask[i] = 1 iff uniform(offset + i) >= p, for i in [lo, hi): words drawn
// kWords at a time by the vectorised Philox (enough for its interleaved groups
// of blocks even when offset is not a multiple of 4).
void draw_mask(const DropoutArgs& a, int64_t lo, int64_t hi, uint8_t* mask) {
  constexpr int64_t kWords = 1024;
  const Philox rng(a.seed, a.stream);
  const float p = a.p;  // a local: the byte stores could alias a.p (no vectors)
  uint32_t words[kWords];
  for (int64_t i = lo; i < hi; i += kWords) {
    const int64_t m = std::min(kWords, hi - i);
    rng.words(a.offset + static_cast<uint64_t>(i), m, words);
    for (int64_t k = 0; k < m; ++k) mask[i + k] = u32_to_uniform(words[k]) >= p ? 1 : 0;
  }
}

// out[i] = in[i] * mask[i] * scale for i in [lo, hi).
template <typename T>
void apply_mask(const T* in, const uint8_t* mask, float scale, T* out, int64_t lo, int64_t hi) {
  float buf[kBlock], res[kBlock];
  for (int64_t i = lo; i < hi; i += kBlock) {
    const int64_t m = std::min(kBlock, hi - i);
    const float* v = cpu_io::as_f32(in + i, buf, m);
    for (int64_t k = 0; k < m; ++k) res[k] = mask[i + k] ? v[k] * scale : 0.0f;
    cpu_io::store_n(res, out + i, m);
  }
}

void check_args(std::string_view op, const DropoutArgs& a, const Tensor& in, const Tensor& mask,
                const Tensor& out) {
  require_dtype(op, "input", in, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(out.dtype() == in.dtype(), "{}: output {} vs input {}", op, out.str(), in.str());
  require_dtype(op, "mask", mask, {DType::u8});
  require_numel(op, "mask", mask, in.numel());
  require_numel(op, "output", out, in.numel());
  DTRAIN_CHECK(a.p >= 0.0f && a.p < 1.0f, "{}: p = {} is outside [0, 1)", op, a.p);
}

}  // namespace

void dropout_forward(const DropoutArgs& args, const Tensor& x, Tensor& y, Tensor& mask) {
  const Device device = same_device("dropout_forward", {&x, &y, &mask});
  check_args("dropout_forward", args, x, mask, y);
  if (device.is_cuda()) return cuda_ops::dropout_forward(args, x, y, mask);
  const float scale = 1.0f / (1.0f - args.p);
  uint8_t* m = mask.data<uint8_t>();
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
    T* yp = static_cast<T*>(y.raw());
    parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      draw_mask(args, lo, hi, m);
      apply_mask(xp, m, scale, yp, lo, hi);
    });
  });
}

void dropout_backward(const DropoutArgs& args, const Tensor& dy, const Tensor& mask, Tensor& dx) {
  const Device device = same_device("dropout_backward", {&dy, &mask, &dx});
  check_args("dropout_backward", args, dy, mask, dx);
  if (device.is_cuda()) return cuda_ops::dropout_backward(args, dy, mask, dx);
  const float scale = 1.0f / (1.0f - args.p);
  const uint8_t* m = mask.data<uint8_t>();
  cpu_io::dispatch_float(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* d = static_cast<const T*>(dy.raw());
    T* out = static_cast<T*>(dx.raw());
    parallel_for(0, dy.numel(), kGrain,
                 [&](int64_t lo, int64_t hi) { apply_mask(d, m, scale, out, lo, hi); });
  });
}

}  // namespace dtrain::kernels
