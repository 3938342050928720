// Philox-4x32-10 with the constants of Random123.
#include "core/rng.h"

#include <cmath>

namespace dtrain {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

inline PhiloxCounter round(PhiloxCounter c, PhiloxKey k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kM0, c[0], hi0, lo0);
  mulhilo(kM1, c[2], hi1, lo1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}
}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    counter = round(counter, key);
  }
  return counter;
}

PhiloxCounter Philox::block(uint64_t block) const {
  const PhiloxCounter ctr = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                             static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)};
  const PhiloxKey key = {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
  return philox4x32_10(ctr, key);
}

uint32_t Philox::u32(uint64_t i) const { return block(i / 4)[i % 4]; }

namespace {
constexpr int kLanes = 16;
using u32v = uint32_t __attribute__((vector_size(kLanes * 4)));
using u64v = uint64_t __attribute__((vector_size(kLanes * 8)));

// philox4x32_10 on 16 counters at once (lane b: blocks first_block + b).
void blocks16(uint64_t first_block, uint64_t stream, uint64_t seed, uint32_t* out) {
  u32v c0, c1, c2, c3;
  for (int b = 0; b < kLanes; ++b) {
    const uint64_t blk = first_block + static_cast<uint64_t>(b);
    c0[b] = static_cast<uint32_t>(blk);
    c1[b] = static_cast<uint32_t>(blk >> 32);
  }
  c2 = u32v{} + static_cast<uint32_t>(stream);
  c3 = u32v{} + static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const u64v p0 = __builtin_convertvector(c0, u64v) * kM0;
    const u64v p1 = __builtin_convertvector(c2, u64v) * kM1;
    const u32v hi0 = __builtin_convertvector(p0 >> 32, u32v),
               lo0 = __builtin_convertvector(p0, u32v);
    const u32v hi1 = __builtin_convertvector(p1 >> 32, u32v),
               lo1 = __builtin_convertvector(p1, u32v);
    const u32v n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  for (int b = 0; b < kLanes; ++b) {
    out[4 * b + 0] = c0[b];
    out[4 * b + 1] = c1[b];
    out[4 * b + 2] = c2[b];
    out[4 * b + 3] = c3[b];
  }
}
}  // namespace

void Philox::words(uint64_t first, int64_t n, uint32_t* out) const {
  int64_t k = 0;
  // Up to the first whole block, and whatever does not fill 16 blocks, one block at a time.
  while (k < n && (first + static_cast<uint64_t>(k)) % 4 != 0) {
    out[k] = u32(first + static_cast<uint64_t>(k));
    ++k;
  }
  for (; k + 4 * kLanes <= n; k += 4 * kLanes)
    blocks16((first + static_cast<uint64_t>(k)) / 4, stream_, seed_, out + k);
  for (; k < n; k += 4) {
    const PhiloxCounter w = block((first + static_cast<uint64_t>(k)) / 4);
    for (int64_t j = 0; j < 4 && k + j < n; ++j) out[k + j] = w[static_cast<size_t>(j)];
  }
}

float Philox::uniform(uint64_t i) const { return u32_to_uniform(u32(i)); }

float Philox::normal(uint64_t i) const {
  // Box-Muller; u1 in (0, 1] so the log is finite.
  const float u1 = 1.0f - uniform(2 * i);
  const float u2 = uniform(2 * i + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864769f * u2);
}

uint64_t rng_stream_id(uint32_t purpose, uint32_t rank, uint64_t index) {
  return (static_cast<uint64_t>(purpose & 0xffu) << 56) |
         (static_cast<uint64_t>(rank & 0xffffu) << 40) | (index & ((uint64_t{1} << 40) - 1));
}

}  // namespace dtrain
