// Textbook fp64 activations:
//   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   gelu_erf(x)  = 0.5 x (1 + erf(x / sqrt 2))
#include "ref/activation.h"

#include <cmath>

namespace dtrain::ref {

namespace {
const double kPi = std::acos(-1.0);
const double kK = std::sqrt(2.0 / kPi);
constexpr double kC = 0.044715;
}  // namespace

double activation(Activation act, double x) {
  switch (act) {
    case Activation::relu:
      return x > 0 ? x : 0.0;
    case Activation::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(kK * (x + kC * x * x * x)));
    case Activation::gelu_erf:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::tanh:
      return std::tanh(x);
  }
  return 0.0;
}

double activation_derivative(Activation act, double x) {
  switch (act) {
    case Activation::relu:
      return x > 0 ? 1.0 : 0.0;
    case Activation::gelu_tanh: {
      const double t = std::tanh(kK * (x + kC * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kK * (1 + 3 * kC * x * x);
    }
    case Activation::gelu_erf:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-x * x / 2) / std::sqrt(2 * kPi);
    case Activation::tanh:
      return 1 - std::tanh(x) * std::tanh(x);
  }
  return 0.0;
}

}  // namespace dtrain::ref
