// Philox-4x32-10 for the device, word for word src/core/rng.h's stream: key =
// seed, counter = (block, stream), word i in block i / 4 at lane i % 4, and
// u32_to_uniform(x) = (x >> 8) * 2^-24. Host-and-device functions of plain
// integer maths, so tests/kernels/test_philox_device.cpp checks them on the
// CPU against the host Philox and Random123's known answers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DTRAIN_HOST_DEVICE __host__ __device__
#else
#define DTRAIN_HOST_DEVICE
#endif

namespace dtrain::kernels::cuda_ops::philox {

inline constexpr uint32_t kM0 = 0xD2511F53u;
inline constexpr uint32_t kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1

struct Words {
  uint32_t w[4];
};

DTRAIN_HOST_DEVICE inline Words round(Words c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kM0) * c.w[0];
  const uint64_t p1 = static_cast<uint64_t>(kM1) * c.w[2];
  return {{static_cast<uint32_t>(p1 >> 32) ^ c.w[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ c.w[3] ^ k1, static_cast<uint32_t>(p0)}};
}

DTRAIN_HOST_DEVICE inline Words philox4x32_10(Words c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    c = round(c, k0, k1);
  }
  return c;
}

// The four words of block `block` of stream (seed, stream).
DTRAIN_HOST_DEVICE inline Words block(uint64_t seed, uint64_t stream, uint64_t block) {
  const Words ctr = {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                      static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

DTRAIN_HOST_DEVICE inline float u32_to_uniform(uint32_t x) {
  return static_cast<float>(x >> 8) * 0x1p-24f;
}

}  // namespace dtrain::kernels::cuda_ops::philox
