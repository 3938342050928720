// CPU cast: f32, f16, bf16, f64, i32, i64, u8 to any float dtype (f32, f16,
// bf16, f64). Each result is the source value rounded ONCE to nearest even:
// wide sources reach a half type through f32 rounded to odd, which never
// changes the final rounding (f32 keeps >= 2 more bits than f16 or bf16).
// Float to integer casts are not provided.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/elementwise.h"

namespace dtrain::kernels {

namespace {

using cpu_io::kBlock;

constexpr int64_t kGrain = int64_t{1} << 15;

// d rounded to f32 toward an odd last bit when inexact ("round to odd"): of
// the two floats around d, the one with an odd mantissa (FLT_MAX past the top).
float f64_to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::isinf(f)) return std::copysign(FLT_MAX, f);
  if ((std::bit_cast<uint32_t>(f) & 1u) == 0) {
    f = std::nextafter(f, static_cast<double>(f) < d ? INFINITY : -INFINITY);
  }
  return f;
}

// v rounded to 24 significant bits, truncating with a sticky odd bit.
float i64_to_f32_odd(int64_t v) {
  const uint64_t mag = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  const int shift = std::max(0, static_cast<int>(std::bit_width(mag)) - 24);
  uint64_t m = mag >> shift;
  if (shift > 0 && (mag & ((uint64_t{1} << shift) - 1)) != 0) m |= 1;
  const float f = std::ldexp(static_cast<float>(m), shift);  // exact: m < 2^24
  return v < 0 ? -f : f;
}

// One source element as the f32 from which the destination rounds correctly:
// exact, rounded to nearest (destination f32) or rounded to odd (half).
template <typename S>
float source_f32(S s, bool to_half) {
  if constexpr (std::is_same_v<S, double>) {
    return to_half ? f64_to_f32_odd(s) : static_cast<float>(s);
  } else if constexpr (std::is_same_v<S, int32_t> || std::is_same_v<S, int64_t>) {
    return to_half ? i64_to_f32_odd(s) : static_cast<float>(s);
  } else if constexpr (std::is_same_v<S, uint8_t>) {
    return static_cast<float>(s);
  } else {
    return cpu_io::load(&s, 0);
  }
}

template <typename S>
double source_f64(S s) {
  if constexpr (std::is_same_v<S, f16> || std::is_same_v<S, bf16>) {
    return cpu_io::load(&s, 0);
  } else {
    return static_cast<double>(s);
  }
}

template <typename S, typename D>
void cast_range(const S* src, D* dst, int64_t lo, int64_t hi) {
  if constexpr (std::is_same_v<D, double>) {
    for (int64_t i = lo; i < hi; ++i) dst[i] = source_f64(src[i]);
  } else if constexpr (std::is_same_v<S, float> || std::is_same_v<S, f16> ||
                       std::is_same_v<S, bf16>) {
    float buf[kBlock];  // f32 / half to f32 / half: vectorised block conversion
    for (int64_t i = lo; i < hi; i += kBlock) {
      const int64_t m = std::min(kBlock, hi - i);
      cpu_io::store_n(cpu_io::as_f32(src + i, buf, m), dst + i, m);
    }
  } else {
    constexpr bool to_half = !std::is_same_v<D, float>;
    for (int64_t i = lo; i < hi; ++i) cpu_io::store(dst, i, source_f32(src[i], to_half));
  }
}

template <typename Fn>
void dispatch_any(DType t, Fn&& fn) {
  switch (t) {
    case DType::f64:
      fn(double{});
      return;
    case DType::i32:
      fn(int32_t{});
      return;
    case DType::i64:
      fn(int64_t{});
      return;
    case DType::u8:
      fn(uint8_t{});
      return;
    default:
      cpu_io::dispatch_float(t, fn);
  }
}

}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  const Device device = same_device("cast", {&src, &dst});
  require_dtype(
      "cast", "src", src,
      {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8});
  require_dtype("cast", "dst", dst, {DType::f32, DType::f16, DType::bf16, DType::f64});
  require_numel("cast", "dst", dst, src.numel());
  if (device.is_cuda()) return cuda_ops::cast(src, dst);
  dispatch_any(src.dtype(), [&](auto stag) {
    using S = decltype(stag);
    dispatch_any(dst.dtype(), [&](auto dtag) {
      using D = decltype(dtag);
      if constexpr (std::is_floating_point_v<D> || std::is_same_v<D, f16> ||
                    std::is_same_v<D, bf16>) {
        const S* s = static_cast<const S*>(src.raw());
        D* d = static_cast<D*>(dst.raw());
        parallel_for(0, src.numel(), kGrain,
                     [&](int64_t lo, int64_t hi) { cast_range(s, d, lo, hi); });
      }
    });
  });
}

}  // namespace dtrain::kernels
