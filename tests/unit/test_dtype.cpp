// Half-precision conversions, checked exhaustively: all 65,536 f16 and bf16
// bit patterns, against an independent fp64 computation of the exact values
// and of round-to-nearest-even.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"

using namespace dtrain;

namespace {

// The exact value of an f16 pattern, from the IEEE definition.
double f16_exact(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

double bf16_exact(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  if (exp == 0xff) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -133);
  return sign * std::ldexp(128 + mant, exp - 134);
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Checks that `to_half(x)` rounds x (a float strictly between the adjacent
// halves lo and hi) as round-to-nearest-even demands.
template <typename ToHalf, typename Exact>
void check_between(uint16_t lo, uint16_t hi, ToHalf to_half, Exact exact) {
  const double a = exact(lo), b = exact(hi);
  const double mid = (a + b) / 2;
  const float fmid = static_cast<float>(mid);
  REQUIRE(static_cast<double>(fmid) == mid);  // midpoints are representable in f32
  const uint16_t even = (lo & 1) ? hi : lo;
  CHECK(to_half(fmid) == even);
  const float below = std::nextafter(fmid, static_cast<float>(a));
  const float above = std::nextafter(fmid, static_cast<float>(b));
  CHECK(to_half(below) == lo);
  CHECK(to_half(above) == hi);
}

}  // namespace

TEST_CASE("f16: every bit pattern decodes exactly and round-trips") {
  int nans = 0;
  for (uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const double want = f16_exact(h);
    const float got = f16_bits_to_f32(h);
    if (std::isnan(want)) {
      ++nans;
      REQUIRE(std::isnan(got));
      REQUIRE((f32_to_f16_bits(got) & 0x7c00) == 0x7c00);
      REQUIRE((f32_to_f16_bits(got) & 0x03ff) != 0);
      REQUIRE((f32_to_f16_bits(got) & 0x8000) == (h & 0x8000));
      continue;
    }
    REQUIRE(static_cast<double>(got) == want);
    REQUIRE(f32_to_f16_bits(got) == h);  // includes -0, subnormals and +-Inf
  }
  CHECK(nans == 2 * 1023);
}

TEST_CASE("f16: rounding to nearest even between every pair of neighbours") {
  for (uint32_t p = 0; p < 0x7bff; ++p) {  // positive finite neighbours (lo, lo + 1)
    const auto lo = static_cast<uint16_t>(p);
    check_between(lo, static_cast<uint16_t>(lo + 1), f32_to_f16_bits, f16_exact);
    check_between(static_cast<uint16_t>(lo | 0x8000), static_cast<uint16_t>((lo + 1) | 0x8000),
                  f32_to_f16_bits, f16_exact);
  }
}

TEST_CASE("f16: overflow, underflow and special values") {
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65519.99f) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);  // the midpoint to the next binade rounds to Inf
  CHECK(f32_to_f16_bits(1e30f) == 0x7c00);
  CHECK(f32_to_f16_bits(-1e30f) == 0xfc00);
  CHECK(f32_to_f16_bits(INFINITY) == 0x7c00);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // half of the smallest: tie to 0
  CHECK(f32_to_f16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(f32_to_f16_bits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: tie to even (2)
  CHECK(f32_to_f16_bits(1e-30f) == 0x0000);
  CHECK(f32_to_f16_bits(-1e-30f) == 0x8000);
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK((f32_to_f16_bits(bits_to_float(0x7f800001u)) & 0x7fff) >
        0x7c00);  // signalling NaN stays NaN
}

TEST_CASE("bf16: every bit pattern decodes exactly and round-trips") {
  for (uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const double want = bf16_exact(h);
    const float got = bf16_bits_to_f32(h);
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      REQUIRE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(got))));
      continue;
    }
    REQUIRE(static_cast<double>(got) == want);
    REQUIRE(f32_to_bf16_bits(got) == h);
  }
}

TEST_CASE("bf16: rounding to nearest even between every pair of neighbours") {
  for (uint32_t p = 0; p < 0x7f7f; ++p) {
    const auto lo = static_cast<uint16_t>(p);
    check_between(lo, static_cast<uint16_t>(lo + 1), f32_to_bf16_bits, bf16_exact);
  }
  CHECK(f32_to_bf16_bits(bits_to_float(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds to Inf
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(bits_to_float(0x7f800001u)))));
}

TEST_CASE("dtype names parse back and sizes are right") {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    CHECK(parse_dtype(dtype_name(t)) == t);
  }
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::i64) == 8);
  CHECK_THROWS_WITH_AS(parse_dtype("fp8"), doctest::Contains("unknown dtype \"fp8\""), Error);
}
