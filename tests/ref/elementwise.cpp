// Textbook fp64 bias-add and format rounding: the spec the CPU (and later CUDA)
// elementwise and cast kernels are checked against. Plain loops, no speed.
#include "ref/elementwise.h"

#include <cmath>
#include <limits>

namespace dtrain::ref {

void bias_add(int64_t outer, int64_t channels, int64_t inner, const double* x, const double* bias,
              double* y) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t at = (o * channels + c) * inner + i;
        y[at] = x[at] + bias[c];
      }
}

void bias_add_backward(int64_t outer, int64_t channels, int64_t inner, const double* dy,
                       double* dbias) {
  for (int64_t c = 0; c < channels; ++c) {
    double s = 0.0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) s += dy[(o * channels + c) * inner + i];
    dbias[c] = s;
  }
}

double round_to_format(double v, int precision, int emin, int emax) {
  if (std::isnan(v) || std::isinf(v) || v == 0.0) return v;
  int e = 0;
  std::frexp(v, &e);                       // |v| = m 2^e, m in [0.5, 1): leading bit 2^(e-1)
  const int lead = std::max(e - 1, emin);  // subnormals share the lowest binade's spacing
  const double ulp = std::ldexp(1.0, lead - (precision - 1));
  const double q = std::abs(v) / ulp;  // exact: scaling by a power of two
  const double below = std::floor(q);
  const double frac = q - below;  // exact
  double k = below;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(below, 2.0) == 1.0)) k = below + 1.0;
  const double mag = k * ulp;
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), emax);
  const double r = mag > max_finite ? std::numeric_limits<double>::infinity() : mag;
  return std::copysign(r, v);
}

double round_to_dtype(double v, DType dst) {
  switch (dst) {
    case DType::f32:
      return round_to_format(v, 24, -126, 127);
    case DType::f16:
      return round_to_format(v, 11, -14, 15);
    case DType::bf16:
      return round_to_format(v, 8, -126, 127);
    default:
      return v;
  }
}

}  // namespace dtrain::ref
