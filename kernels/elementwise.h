// Elementwise arithmetic, bias-add and casts. Same-shape operands; float
// dtypes f32, f16, bf16 (maths in f32, results rounded to nearest even).
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b
// out = max(a + b, 0): add then ReLU in one pass, their bits (f32 or bf16 on the CPU).
void add_relu(const Tensor& a, const Tensor& b, Tensor& out);
void mul(const Tensor& a, const Tensor& b, Tensor& out);  // out = a * b
void scale(float alpha, const Tensor& x, Tensor& out);    // out = alpha * x
void axpy(float alpha, const Tensor& x, Tensor& y);       // y += alpha * x
void fill(Tensor& x, float value);

// x viewed as [outer, channels, inner]; bias [channels].
// Linear layers: outer = rows, inner = 1. Conv (NCHW): outer = N, inner = H*W.
struct BiasArgs {
  int64_t outer = 1, channels = 1, inner = 1;
};
void bias_add(const BiasArgs& args, const Tensor& x, const Tensor& bias, Tensor& y);
// dbias[c] = sum over outer, inner of dy (overwritten)
void bias_add_backward(const BiasArgs& args, const Tensor& dy, Tensor& dbias);

// Any of f32, f16, bf16, f64, i32, i64, u8 to any float type, and float to
// float. Float to half rounds to nearest even; NaN/Inf are preserved.
void cast(const Tensor& src, Tensor& dst);

}  // namespace dtrain::kernels
