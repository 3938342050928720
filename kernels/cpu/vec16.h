// The 16-float GCC vector type the vectorised CPU kernels (activation, attention,
// layer norm) are written in, with unaligned loads and stores through memcpy (which
// compile to single vector moves) and a broadcast. Reductions stay with each kernel:
// their summation orders differ on purpose (the results are part of each kernel's bits).
#pragma once

#include <cstdint>
#include <cstring>

namespace dtrain::kernels::vec {

constexpr int64_t kV = 16;  // floats per vector
using v16 = float __attribute__((vector_size(kV * sizeof(float))));
using v16i = int32_t __attribute__((vector_size(kV * sizeof(int32_t))));

inline v16 vload(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline v16 splat(float x) { return v16{} + x; }

}  // namespace dtrain::kernels::vec
