// Load/store helpers for the pointwise CPU kernels: f32, f16 and bf16 elements
// are read as f32 and written back rounded to nearest even, bit-identical to
// core/dtype.h (F16C/AVX-512 where the build has them, its integer code where
// not), except that F16C quiets a signalling f16 NaN on load (checked over all
// 65,536 f16 patterns and 1 in 13 f32 patterns). Block versions convert up to
// kBlock elements through a stack buffer so the arithmetic loops stay plain f32
// and vectorise. No allocation, no threads.
#pragma once

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <bit>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace dtrain::kernels::cpu {

constexpr int64_t kBlock = 256;  // elements per stack buffer (1 KiB of f32)

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

// Round to nearest even by adding 0x7fff plus the kept lsb; NaN stays quiet NaN.
inline uint16_t float_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  const uint16_t nan = static_cast<uint16_t>((u >> 16) | 0x0040u);
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

inline float f16_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_bits_to_f32(h);
#endif
}

inline uint16_t float_to_f16(float x) {
#if defined(__F16C__)
  return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  return f32_to_f16_bits(x);
#endif
}

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const f16* p, int64_t i) { return f16_to_float(p[i].bits); }
inline float load(const bf16* p, int64_t i) { return bf16_to_float(p[i].bits); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(f16* p, int64_t i, float v) { p[i].bits = float_to_f16(v); }
inline void store(bf16* p, int64_t i, float v) { p[i].bits = float_to_bf16(v); }

// src[0, n) -> dst[0, n) as f32.
template <typename T>
inline void load_block(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, f16>) {
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(0xffff, h));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = load(src, i);
}

// src[0, n) f32 -> dst[0, n), rounded to nearest even.
template <typename T>
inline void store_block(const float* src, T* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, f16>) {
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(src + i),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
  }
#endif
  for (; i < n; ++i) store(dst, i, src[i]);
}

// The f32 view of src[0, n): src itself for f32, else converted into buf.
template <typename T>
inline const float* as_f32(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    load_block(src, buf, n);
    return buf;
  }
}

// Calls fn(T{}) with T the storage type of a float dtype (f32, f16, bf16).
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
      DTRAIN_CHECK(false, "dispatch_float: {} is not f32, f16 or bf16", dtype_name(t));
  }
}

}  // namespace dtrain::kernels::cpu
