// Reference activations in fp64 (the spec for kernels/activation.h):
// relu, gelu with the tanh approximation, gelu with erf, tanh; and their derivatives.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

enum class Activation : uint8_t { relu, gelu_tanh, gelu_erf, tanh };

double activation(Activation act, double x);
double activation_derivative(Activation act, double x);

}  // namespace dtrain::ref
