// Philox-4x32-10 with the constants of Random123.
#include "core/rng.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

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
// Blocks per vector: 16 (zmm) with AVX-512, else 8 (one ymm each: GCC's 16-lane vectors
// there spilled the whole round state through the stack). The words are the same.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
constexpr int kGroups = 4;  // independent groups of kLanes blocks per interleaved call
using u32v = uint32_t __attribute__((vector_size(kLanes * 4)));
using u64v = uint64_t __attribute__((vector_size(kLanes * 4)));  // the same bytes, u64 lanes

// The 32 x 32 -> 64 bit products of m with the low halves of w's u64 lanes: one
// vpmuludq per vector (GCC writes the generic form as vpmullq with AVX-512, 3 uops,
// and as three multiplies with shifts and adds per ymm with AVX2).
inline u64v mul_low_halves(u64v w, uint32_t m) {
#if defined(__AVX512F__)
  const u64v mv = u64v{} + m;
  __m512i wi, mi;
  std::memcpy(&wi, &w, sizeof wi);
  std::memcpy(&mi, &mv, sizeof mi);
  // maskz with every lane on: the unmasked form trips GCC 12's -Wuninitialized.
  const __m512i pi = _mm512_maskz_mul_epu32(0xff, wi, mi);
#elif defined(__AVX2__)
  __m256i wi;
  std::memcpy(&wi, &w, sizeof wi);
  const __m256i pi = _mm256_mul_epu32(wi, _mm256_set1_epi64x(m));
#else
  const u64v pi = (w & 0xffffffffu) * m;
#endif
  u64v p;
  std::memcpy(&p, &pi, sizeof p);
  return p;
}

// hi and lo halves of m * c on every lane. The even and odd lanes are multiplied
// as u64 lanes each (no widening of the vector); on a little-endian machine lane 2i
// of a u32 view is the low half of u64 lane i, so the halves go back into lane order
// by shifts and masks.
static_assert(std::endian::native == std::endian::little,
              "mulhilo16 picks u32 halves of u64 lanes");
inline void mulhilo16(u32v c, uint32_t m, u32v& hi, u32v& lo) {
  u64v w;
  std::memcpy(&w, &c, sizeof w);
  const u64v pe = mul_low_halves(w, m), po = mul_low_halves(w >> 32, m);
  const u64v h = (pe >> 32) | (po & 0xffffffff00000000ull);
  const u64v l = (pe & 0xffffffffull) | (po << 32);
  std::memcpy(&hi, &h, sizeof hi);
  std::memcpy(&lo, &l, sizeof lo);
}

// philox4x32_10 on G groups of kLanes counters (group g, lane b: block first[g] + b).
// The groups are independent chains, run round by round together so that one
// group's multiplies overlap another's latency (one group alone is latency-bound).
template <int G>
void blocks16(const uint64_t* first, uint64_t stream, uint64_t seed, uint32_t* const* out) {
  u32v lane;
  for (int b = 0; b < kLanes; ++b) lane[b] = static_cast<uint32_t>(b);
  u32v c0[G], c1[G], c2[G], c3[G];
  for (int g = 0; g < G; ++g) {
    // Block numbers first + b: the low word wraps into the high word per lane.
    const uint32_t lo = static_cast<uint32_t>(first[g]), hi = static_cast<uint32_t>(first[g] >> 32);
    c0[g] = lane + lo;
    c1[g] = (u32v{} + hi) + (c0[g] < lo ? 1u : 0u);
    c2[g] = u32v{} + static_cast<uint32_t>(stream);
    c3[g] = u32v{} + static_cast<uint32_t>(stream >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    for (int g = 0; g < G; ++g) {
      u32v hi0, lo0, hi1, lo1;
      mulhilo16(c0[g], kM0, hi0, lo0);
      mulhilo16(c2[g], kM1, hi1, lo1);
      c0[g] = hi1 ^ c1[g] ^ k0;
      c2[g] = hi0 ^ c3[g] ^ k1;
      c1[g] = lo1;
      c3[g] = lo0;
    }
  }
  // Lane b of (c0, c1, c2, c3) is block b: interleave into words 4b .. 4b + 3.
  for (int g = 0; g < G; ++g) {
#if defined(__AVX512F__)
    const u32v a = __builtin_shufflevector(c0[g], c1[g], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21,
                                           6, 22, 7, 23);
    const u32v b = __builtin_shufflevector(c0[g], c1[g], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13,
                                           29, 14, 30, 15, 31);
    const u32v c = __builtin_shufflevector(c2[g], c3[g], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21,
                                           6, 22, 7, 23);
    const u32v d = __builtin_shufflevector(c2[g], c3[g], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13,
                                           29, 14, 30, 15, 31);
    const u32v w[4] = {
        __builtin_shufflevector(a, c, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
        __builtin_shufflevector(a, c, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31),
        __builtin_shufflevector(b, d, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
        __builtin_shufflevector(b, d, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30,
                                31)};
#else
    const u32v a = __builtin_shufflevector(c0[g], c1[g], 0, 8, 1, 9, 2, 10, 3, 11);
    const u32v b = __builtin_shufflevector(c0[g], c1[g], 4, 12, 5, 13, 6, 14, 7, 15);
    const u32v c = __builtin_shufflevector(c2[g], c3[g], 0, 8, 1, 9, 2, 10, 3, 11);
    const u32v d = __builtin_shufflevector(c2[g], c3[g], 4, 12, 5, 13, 6, 14, 7, 15);
    const u32v w[4] = {__builtin_shufflevector(a, c, 0, 1, 8, 9, 2, 3, 10, 11),
                       __builtin_shufflevector(a, c, 4, 5, 12, 13, 6, 7, 14, 15),
                       __builtin_shufflevector(b, d, 0, 1, 8, 9, 2, 3, 10, 11),
                       __builtin_shufflevector(b, d, 4, 5, 12, 13, 6, 7, 14, 15)};
#endif
    std::memcpy(out[g], w, sizeof w);
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
  constexpr int64_t kChunk = 4 * kLanes;  // words per 16-block group
  for (; k + kGroups * kChunk <= n; k += kGroups * kChunk) {
    uint64_t blk[kGroups];
    uint32_t* dst[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      blk[g] = (first + static_cast<uint64_t>(k + g * kChunk)) / 4;
      dst[g] = out + k + g * kChunk;
    }
    blocks16<kGroups>(blk, stream_, seed_, dst);
  }
  for (; k + kChunk <= n; k += kChunk) {
    const uint64_t blk = (first + static_cast<uint64_t>(k)) / 4;
    uint32_t* dst = out + k;
    blocks16<1>(&blk, stream_, seed_, &dst);
  }
  for (; k < n; k += 4) {
    const PhiloxCounter w = block((first + static_cast<uint64_t>(k)) / 4);
    for (int64_t j = 0; j < 4 && k + j < n; ++j) out[k + j] = w[static_cast<size_t>(j)];
  }
}

float Philox::uniform(uint64_t i) const { return u32_to_uniform(u32(i)); }

float box_muller(uint32_t a, uint32_t b) {
  const float u1 = 1.0f - u32_to_uniform(a);
  const float u2 = u32_to_uniform(b);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864769f * u2);
}

float Philox::normal(uint64_t i) const {
  const PhiloxCounter w = block(i / 2);  // words 2i and 2i + 1 share a block
  return box_muller(w[2 * (i % 2)], w[2 * (i % 2) + 1]);
}

namespace {
constexpr int64_t kBulk = 2048;  // words per words() call: whole interleaved groups
}  // namespace

void Philox::uniforms(uint64_t first, int64_t n, float* out) const {
  uint32_t w[kBulk];
  for (int64_t k = 0; k < n; k += kBulk) {
    const int64_t m = std::min(kBulk, n - k);
    words(first + static_cast<uint64_t>(k), m, w);
    for (int64_t j = 0; j < m; ++j) out[k + j] = u32_to_uniform(w[j]);
  }
}

void Philox::normals(uint64_t first, int64_t n, float* out) const {
  uint32_t w[kBulk];
  for (int64_t k = 0; k < n; k += kBulk / 2) {
    const int64_t m = std::min(kBulk / 2, n - k);
    words(2 * (first + static_cast<uint64_t>(k)), 2 * m, w);
    for (int64_t j = 0; j < m; ++j) out[k + j] = box_muller(w[2 * j], w[2 * j + 1]);
  }
}

uint64_t rng_stream_id(uint32_t purpose, uint32_t rank, uint64_t index) {
  return (static_cast<uint64_t>(purpose & 0xffu) << 56) |
         (static_cast<uint64_t>(rank & 0xffffu) << 40) | (index & ((uint64_t{1} << 40) - 1));
}

}  // namespace dtrain
