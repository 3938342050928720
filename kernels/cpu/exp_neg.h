// exp(x) for x <= 0 as the vectorised CPU kernels compute it (attention's softmax,
// cross-entropy): 2^n * poly(r) with Cephes coefficients (~1 ulp), exactly 0 below -87
// (where float exp underflows), -inf included. The scalar and vector forms take the
// same steps, so a lane equals the scalar result for it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/vec16.h"

namespace dtrain::kernels::vec {

inline float exp_neg(float x) {
  const float xc = std::max(x, -87.0f);
  const float n = std::floor(xc * 1.44269504f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.0f ? 0.0f : y * scale;
}

// On a vector of floats V with integer lanes VI (16 lanes, or 8): floor by truncation,
// corrected for the negative arguments.
template <typename V, typename VI>
inline V exp_neg_vt(V x) {
  const V lo = V{} - 87.0f;
  const V xc = x < lo ? lo : x;
  const V t = xc * 1.44269504f + 0.5f;
  V n = __builtin_convertvector(__builtin_convertvector(t, VI), V);
  n = n > t ? n - 1.0f : n;
  V r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V y = p * r * r + r + 1.0f;
  const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < lo ? V{} : y * scale;
}
inline v16 exp_neg_v(v16 x) { return exp_neg_vt<v16, v16i>(x); }

}  // namespace dtrain::kernels::vec
