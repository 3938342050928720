// The device Philox of kernels/cuda/philox.cuh, compiled here as host code: its
// constants, round function and stream layout against src/core/rng.h's Philox
// and Random123's known answers. Runs on every machine (no GPU needed); the
// kernel table's dropout/same_mask_as_cpu case checks the real device code.
#include <doctest/doctest.h>

#include <utility>

#include "core/rng.h"
#include "kernels/cuda/philox.cuh"

using namespace dtrain;
namespace dp = dtrain::kernels::cuda_ops::philox;

namespace {
PhiloxCounter as_counter(const dp::Words& w) { return {w.w[0], w.w[1], w.w[2], w.w[3]}; }
}  // namespace

TEST_CASE("device philox4x32-10 matches Random123's known answers") {
  CHECK(as_counter(dp::philox4x32_10({{0, 0, 0, 0}}, 0, 0)) ==
        PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(as_counter(dp::philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                                     0xffffffffu, 0xffffffffu)) ==
        PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(as_counter(dp::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                     0xa4093822u, 0x299f31d0u)) ==
        PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("device philox round function equals the host one on arbitrary inputs") {
  uint32_t s = 12345;
  auto next = [&] { return s = s * 1664525u + 1013904223u; };
  for (int i = 0; i < 1000; ++i) {
    const dp::Words c = {{next(), next(), next(), next()}};
    const uint32_t k0 = next(), k1 = next();
    CHECK(as_counter(dp::philox4x32_10(c, k0, k1)) ==
          philox4x32_10({c.w[0], c.w[1], c.w[2], c.w[3]}, {k0, k1}));
  }
}

TEST_CASE("device philox stream layout and uniform equal the host Philox") {
  for (const auto& [seed, stream] : {std::pair<uint64_t, uint64_t>{0, 0},
                                     {42, 7},
                                     {0x123456789abcdefull, 0xfedcba9876543210ull}}) {
    const Philox host(seed, stream);
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{4}, uint64_t{1} << 33,
                       (uint64_t{1} << 34) + 5}) {
      const dp::Words w = dp::block(seed, stream, i / 4);
      CHECK(w.w[i % 4] == host.u32(i));
      CHECK(dp::u32_to_uniform(w.w[i % 4]) == host.uniform(i));
      CHECK(dp::u32_to_uniform(host.u32(i)) == u32_to_uniform(host.u32(i)));
    }
  }
  CHECK(dp::u32_to_uniform(0xffffffffu) == u32_to_uniform(0xffffffffu));
  CHECK(dp::u32_to_uniform(0xffffffffu) < 1.0f);
}
