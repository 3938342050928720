// Pointwise activations, forward and backward: ReLU, GELU (tanh
// approximation and exact erf form) and tanh. Backward takes the forward input x.
// x, y, dy, dx share one dtype (f32, f16, bf16); maths in f32.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class Activation : uint8_t { relu, gelu_tanh, gelu_erf, tanh };

void activation_forward(Activation act, const Tensor& x, Tensor& y);
void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);

}  // namespace dtrain::kernels
