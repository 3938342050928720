// DType metadata and the f16/bf16 bit conversions. Written out with integer
// arithmetic (not F16C intrinsics) so every machine and the CUDA side agree.
#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

namespace dtrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::f64:
      return 8;
  }
  DTRAIN_CHECK(false, "bad dtype {}", static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::f64:
      return "f64";
  }
  DTRAIN_CHECK(false, "bad dtype {}", static_cast<int>(t));
}

DType parse_dtype(std::string_view name) {
  for (DType t :
       {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::f64}) {
    if (dtype_name(t) == name) return t;
  }
  throw Error(fmt::format("unknown dtype \"{}\"", name),
              "use one of f32, f16, bf16, i32, i64, u8, f64");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}

static uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

static float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint16_t f32_to_f16_bits(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  const int exp = static_cast<int>(abs >> 23) - 127;
  if (exp >= -14) {  // normal half: 10 mantissa bits, round the dropped 13 to nearest even
    uint32_t mant = abs & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: signed zero
  // Subnormal half: value = m * 2^-24 with m = full_mantissa >> (shift).
  const uint32_t full = (abs & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 14 + 13;  // 14..24
  uint32_t h = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  int e = -1;  // normalise the subnormal
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return bits_float(sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13));
}

uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties to even; overflow rounds to Inf
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_bits_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

}  // namespace dtrain
