// Counter-based random numbers: Philox-4x32-10 (Salmon et al., SC'11). A draw
// is a pure function of (seed, stream, counter), so any element of any stream
// can be produced independently, in any order, on the CPU or a CUDA device,
// and a resumed run draws exactly what an uninterrupted one would.
#pragma once

#include <array>
#include <cstdint>

namespace dtrain {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// The raw block function: 10 rounds, 4 x 32-bit outputs.
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// Named streams keep purposes apart (dropout of layer 3 never sees the
// numbers of the data shuffle). A stream id is any 64-bit value; see
// rng_stream_id() for composing (purpose, step, rank, index).
class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

  // Four 32-bit words for block `block`: key = seed, counter = (block, stream).
  PhiloxCounter block(uint64_t block) const;
  // The i-th 32-bit word of the stream (word i lives in block i/4, lane i%4).
  uint32_t u32(uint64_t i) const;
  // Uniform in [0, 1) with 24 random bits: (u32 >> 8) * 2^-24.
  float uniform(uint64_t i) const;
  // Standard normal via Box-Muller on words 2i and 2i+1.
  float normal(uint64_t i) const;
  // out[k] = uniform(first + k) and normal(first + k) for k in [0, n): the same bits,
  // the words drawn by words() (a weight initialisation's whole tensor at once).
  void uniforms(uint64_t first, int64_t n, float* out) const;
  void normals(uint64_t first, int64_t n, float* out) const;
  // out[k] = u32(first + k) for k in [0, n): the same words, 16 blocks at a time
  // in vector registers (8 without AVX-512), four such groups interleaved where n
  // allows (dropout masks draw one word per element; ask for 256+ words per call for
  // full speed).
  void words(uint64_t first, int64_t n, uint32_t* out) const;

 private:
  uint64_t seed_;
  uint64_t stream_;
};

inline float u32_to_uniform(uint32_t x) { return static_cast<float>(x >> 8) * 0x1p-24f; }

// Box-Muller on two words; u1 = 1 - uniform(a) is in (0, 1], so the log is finite.
float box_muller(uint32_t a, uint32_t b);

// Packs purpose (8 bits), rank (16 bits) and index (40 bits) into a stream id.
uint64_t rng_stream_id(uint32_t purpose, uint32_t rank, uint64_t index);

}  // namespace dtrain
