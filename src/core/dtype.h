// Element types and the half-precision conversions (round-to-nearest-even,
// NaN and Inf preserved). f64 exists for tests and references only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain {

enum class DType : uint8_t { f32, f16, bf16, i32, i64, u8, f64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // throws Error naming the accepted spellings
bool is_floating(DType t);

// Bit-level conversions. f32 -> half rounds to nearest, ties to even; NaN stays
// NaN (quiet), overflow becomes Inf, tiny values become subnormals or signed zero.
uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(uint16_t h);

// Storage types for half data: plain 16-bit patterns, so memory layout is exact.
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

inline float to_f32(f16 v) { return f16_bits_to_f32(v.bits); }
inline float to_f32(bf16 v) { return bf16_bits_to_f32(v.bits); }
inline float to_f32(float v) { return v; }
inline f16 to_f16(float x) { return f16{f32_to_f16_bits(x)}; }
inline bf16 to_bf16(float x) { return bf16{f32_to_bf16_bits(x)}; }

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}

}  // namespace dtrain
