// Inline f32/f16/bf16 load/store helpers shared by every CPU kernel: elements
// are read as f32 and written back rounded to nearest even, NaN kept NaN, bit
// for bit as core/dtype.h for every input pattern (F16C / AVX-512 where the
// build has them, plain integer code where not). Span and block converters
// keep the arithmetic loops in plain f32 so they vectorise. No allocation, no
// threads; no other dtypes (integers go through their own kernels).
#pragma once

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace dtrain::kernels::cpu_io {

constexpr int64_t kBlock = 256;  // elements per stack buffer (1 KiB of f32)

// bf16 is the top half of an f32, so widening is a shift.
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

// Round to nearest even by adding 0x7fff plus the kept lsb (a carry out of the
// mantissa bumps the exponent, and the largest finite values round to Inf).
// A NaN would carry into the sign, so it is truncated and forced quiet instead.
inline uint16_t float_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  const uint16_t nan = static_cast<uint16_t>((u >> 16) | 0x0040u);
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

// f16 signalling NaN: exponent all ones, quiet bit (bit 9) clear, payload non-zero.
inline bool is_f16_snan(uint16_t h) { return (h & 0x7e00u) == 0x7c00u && (h & 0x01ffu) != 0; }

// F16C widens exactly except that it sets the quiet bit (f32 bit 22) of a
// signalling NaN; core/dtype.h keeps the pattern, so that bit is cleared again.
inline float f16_to_float(uint16_t h) {
#if defined(__F16C__)
  const uint32_t u = std::bit_cast<uint32_t>(_cvtsh_ss(h));
  return std::bit_cast<float>(is_f16_snan(h) ? u & ~0x00400000u : u);
#else
  return f16_bits_to_f32(h);
#endif
}

// F16C narrowing already matches core/dtype.h on every f32 pattern: it quiets a
// NaN before truncating the payload, which is what the integer code does.
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

// Eight consecutive elements as one f32 vector and back (channel-blocked kernels: eight
// channels of a position), bit for bit as load / store per lane; f32 and bf16.
using v8f = float __attribute__((vector_size(32)));
inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
using v8h = uint16_t __attribute__((vector_size(16)));
inline v8f load8(const bf16* p) {
  using v8u = uint32_t __attribute__((vector_size(32)));
  v8h h;
  std::memcpy(&h, p, sizeof h);
  const v8u w = __builtin_convertvector(h, v8u) << 16;
  v8f v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
inline v8h round8_bf16(v8f v) {  // float_to_bf16, lane by lane
  using v8u = uint32_t __attribute__((vector_size(32)));
  v8u u;
  std::memcpy(&u, &v, sizeof u);
  const v8u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const v8u nan = (u >> 16) | 0x0040u;
  const v8u r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  return __builtin_convertvector(r, v8h);
}
inline void store8(bf16* p, v8f v) {
  const v8h h = round8_bf16(v);
  std::memcpy(p, &h, sizeof h);
}

#if defined(__AVX512F__)
// The zero-masked forms with every lane enabled compile to the plain
// instructions; GCC 12 warns -Wmaybe-uninitialized on the unmasked intrinsics
// (their _mm512_undefined_* source) at every inlined call site.
constexpr __mmask16 kAll = 0xffff;

// 16 f16 -> 16 f32, with the same signalling-NaN fix-up as f16_to_float.
inline __m512 load16_f16(const f16* src) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m512i w = _mm512_maskz_cvtepu16_epi32(kAll, h);
  const __mmask16 nan_exp = _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7e00)),
                                                    _mm512_set1_epi32(0x7c00));
  const __mmask16 snan = _mm512_mask_test_epi32_mask(nan_exp, w, _mm512_set1_epi32(0x01ff));
  const __m512i f = _mm512_castps_si512(_mm512_maskz_cvtph_ps(kAll, h));
  return _mm512_castsi512_ps(_mm512_mask_andnot_epi32(f, snan, _mm512_set1_epi32(0x00400000), f));
}

// 16 bf16 -> 16 f32: zero-extend each lane and shift it into the top half.
inline __m512 load16_bf16(const bf16* src) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
}

// 16 f32 -> 16 f16; like float_to_f16 it needs no fix-up.
inline void store16_f16(const float* src, f16* dst) {
  const __m256i h = _mm512_maskz_cvtps_ph(kAll, _mm512_loadu_ps(src),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
}

// 16 f32 -> 16 bf16, the lane-wise form of float_to_bf16.
inline void store16_bf16(const float* src, bf16* dst) {
  const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src));
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_maskz_srli_epi32(kAll, _mm512_add_epi32(u, bias), 16);
  const __m512i quiet =
      _mm512_or_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i out = _mm512_mask_mov_epi32(rounded, nan, quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_maskz_cvtepi32_epi16(kAll, out));
}
#endif

// dst[0, n) = f32(src[0, n)), any n: 16 lanes at a time, then a scalar tail.
template <typename T>
inline void load_n(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, f16>) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16_f16(src + i));
  } else if constexpr (std::is_same_v<T, bf16>) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16_bf16(src + i));
  }
#endif
  for (; i < n; ++i) dst[i] = load(src, i);
}

// dst[0, n) = T(src[0, n)) rounded to nearest even, any n.
template <typename T>
inline void store_n(const float* src, T* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, f16>) {
    for (; i + 16 <= n; i += 16) store16_f16(src + i, dst + i);
  } else if constexpr (std::is_same_v<T, bf16>) {
    for (; i + 16 <= n; i += 16) store16_bf16(src + i, dst + i);
  }
#endif
  for (; i < n; ++i) store(dst, i, src[i]);
}

// The f32 view of src[0, n): src itself for f32, else converted into buf
// (which must hold n floats; callers use kBlock-sized stack buffers).
template <typename T>
inline const float* as_f32(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    load_n(src, buf, n);
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

}  // namespace dtrain::kernels::cpu_io
