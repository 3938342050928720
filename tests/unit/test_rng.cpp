// Philox-4x32-10 against the known-answer vectors published with Random123
// (kat_vectors), and the stream/counter properties dtrain relies on.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/rng.h"

using namespace dtrain;

TEST_CASE("philox4x32-10 known-answer vectors") {
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                      {0xffffffffu, 0xffffffffu}) ==
        PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                      {0xa4093822u, 0x299f31d0u}) ==
        PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("philox draws are a pure function of (seed, stream, counter)") {
  const Philox a(42, 7), b(42, 7), other_stream(42, 8), other_seed(43, 7);
  for (uint64_t i : {0ull, 1ull, 5ull, 1000003ull}) {
    CHECK(a.u32(i) == b.u32(i));
    CHECK(a.u32(i) == a.block(i / 4)[i % 4]);
  }
  int same_stream = 0, same_seed = 0;
  for (uint64_t i = 0; i < 256; ++i) {
    same_stream += a.u32(i) == other_stream.u32(i);
    same_seed += a.u32(i) == other_seed.u32(i);
  }
  CHECK(same_stream < 2);
  CHECK(same_seed < 2);
}

TEST_CASE("uniform and normal draws have the right moments") {
  const Philox rng(1, 2);
  const int n = 200000;
  double sum = 0, sq = 0, nsum = 0, nsq = 0;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform(i);
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
    sq += u * u;
    const double z = rng.normal(i);
    REQUIRE(std::isfinite(z));
    nsum += z;
    nsq += z * z;
  }
  CHECK(std::abs(sum / n - 0.5) < 0.005);
  CHECK(std::abs(sq / n - 1.0 / 3) < 0.005);
  CHECK(std::abs(nsum / n) < 0.01);
  CHECK(std::abs(nsq / n - 1.0) < 0.02);
}

TEST_CASE("stream ids keep purpose, rank and index apart") {
  std::set<uint64_t> ids;
  for (uint32_t p = 0; p < 4; ++p)
    for (uint32_t r = 0; r < 4; ++r)
      for (uint64_t i = 0; i < 4; ++i) ids.insert(rng_stream_id(p, r, i));
  CHECK(ids.size() == 64);
}

TEST_CASE("Philox words(): the vectorised draw equals u32() word for word") {
  const Philox rng(0x1234'5678'9abc'def0ull, 0x0fed'cba9'8765'4321ull);
  // Unaligned starts, lengths around the chunks (32 or 64 words: 8 or 16 blocks a
  // vector) and the interleaved groups (128 or 256 words), and blocks across 2^32.
  const uint64_t starts[] = {0, 1, 3, 4, 62, 1000, (uint64_t{1} << 34) - 70};
  const int64_t lengths[] = {0,   1,   5,   31,  32,  33,  63,  64,  65,
                             127, 128, 129, 130, 255, 256, 300, 515, 1100};
  for (uint64_t first : starts) {
    for (int64_t n : lengths) {
      CAPTURE(first);
      CAPTURE(n);
      std::vector<uint32_t> got(static_cast<size_t>(n) + 1, 0xdeadbeefu);
      rng.words(first, n, got.data());
      int64_t bad = 0;
      for (int64_t k = 0; k < n; ++k)
        bad += got[static_cast<size_t>(k)] != rng.u32(first + static_cast<uint64_t>(k));
      CHECK(bad == 0);
      CHECK(got[static_cast<size_t>(n)] == 0xdeadbeefu);  // nothing written past n
    }
  }
}

TEST_CASE(
    "Philox uniforms() and normals(): the bulk draws equal uniform() and normal() bit for bit") {
  const Philox rng(0x0bad'cafe'1234'5678ull, 0x42ull);
  // Box-Muller on words 2i and 2i + 1, written out from u32(): normal() reads both
  // from one block.
  auto box_muller_of = [&](uint64_t i) {
    const float u1 = 1.0f - u32_to_uniform(rng.u32(2 * i)), u2 = u32_to_uniform(rng.u32(2 * i + 1));
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864769f * u2);
  };
  const uint64_t starts[] = {0, 1, 3, 1001, (uint64_t{1} << 33) - 5};
  const int64_t lengths[] = {0, 1, 7, 64, 1023, 1024, 1025, 2049, 5000};
  for (uint64_t first : starts) {
    for (int64_t n : lengths) {
      CAPTURE(first);
      CAPTURE(n);
      std::vector<float> u(static_cast<size_t>(n) + 1, -7.0f), z(static_cast<size_t>(n) + 1, -7.0f);
      rng.uniforms(first, n, u.data());
      rng.normals(first, n, z.data());
      int64_t bad = 0;
      for (int64_t k = 0; k < n; ++k) {
        const uint64_t i = first + static_cast<uint64_t>(k);
        const float zi = rng.normal(i), ui = rng.uniform(i);
        bad += std::memcmp(&u[static_cast<size_t>(k)], &ui, 4) != 0;
        bad += std::memcmp(&z[static_cast<size_t>(k)], &zi, 4) != 0;
        const float ref = box_muller_of(i);
        bad += std::memcmp(&zi, &ref, 4) != 0;
      }
      CHECK(bad == 0);
      CHECK(u[static_cast<size_t>(n)] == -7.0f);  // nothing written past n
      CHECK(z[static_cast<size_t>(n)] == -7.0f);
    }
  }
}
