// Inline f32/f16/bf16 load-store helpers for the CPU dense kernels (batch
// norm, pooling, attention): scalar conversions the compiler can inline and
// row converters that use F16C / plain bit tricks. Rounding is nearest-even
// with NaN kept quiet, exactly as core/dtype.h. No threading, no allocation.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace dtrain::kernels::dense {

inline float load(float v) { return v; }
inline float load(bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float load(f16 v) {
#ifdef __F16C__
  return _cvtsh_ss(v.bits);
#else
  return f16_bits_to_f32(v.bits);
#endif
}

inline void store(float& d, float v) { d = v; }
inline void store(bf16& d, float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    d.bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  d.bits = static_cast<uint16_t>(u >> 16);
}
inline void store(f16& d, float v) {
#ifdef __F16C__
  d.bits = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
#else
  d.bits = f32_to_f16_bits(v);
#endif
}

// dst[0:n] = float(src[0:n])
template <typename T>
inline void load_row(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 2) {
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      __m512 f;
      if constexpr (std::is_same_v<T, f16>) {
        f = _mm512_cvtph_ps(h);
      } else {
        f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      _mm512_storeu_ps(dst + i, f);
    }
  }
#endif
  for (; i < n; ++i) dst[i] = load(src[i]);
}

// dst[0:n] = T(src[0:n]), rounded to nearest even
template <typename T>
inline void store_row(const float* src, T* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, f16>) {
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
  }
#endif
  for (; i < n; ++i) store(dst[i], src[i]);
}

// Calls fn(T{}) with T the storage type of a floating dtype (f32, f16, bf16).
template <typename Fn>
inline void dispatch_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32:
      fn(float{});
      return;
    case DType::f16:
      fn(f16{});
      return;
    case DType::bf16:
      fn(bf16{});
      return;
    default:
      DTRAIN_CHECK(false, "dtype {} is not a float storage type", dtype_name(t));
  }
}

}  // namespace dtrain::kernels::dense
