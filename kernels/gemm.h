// GEMM: C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b in [0, batch),
// row-major, strided batches. A and B share one dtype (f32, bf16 or f16); C is
// f32 or the same dtype as A. Products accumulate in f32. CPU: oneDNN matmul;
// CUDA: cuBLASLt (kernels/cuda/gemm.cpp).
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class Trans : uint8_t { no, yes };

// GemmArgs::math (kernels/common.h's MathMode): fp32 or, on CUDA when the job sets
// precision.tf32, TF32 tensor cores for f32 inputs. Half inputs always use tensor
// cores with f32 accumulation.

// What is applied to the product before C is stored. bias: C[b][i][j] += bias[j] for
// every batch b and row i (a linear layer's bias, fused: oneDNN's matmul bias on the
// CPU, cuBLASLt's BIAS epilogue on CUDA); alpha must then be 1.
// bias_gelu: C = gelu_tanh(A B + bias), GELU's tanh approximation (the one cuBLASLt's
// GELU epilogue computes; GPT-2's), and the pre-activation A B + bias is also stored in
// `pre` (what the backward needs); batch 1, alpha 1, beta 0. CUDA: cuBLASLt's
// GELU_AUX_BIAS epilogue (one pass), or, where cuBLASLt offers no algorithm for it,
// the BIAS epilogue into pre and our GELU kernel. CPU: the bias GEMM into pre, then
// the activation kernel (the same numbers as a linear op followed by a GELU op).
enum class Epilogue : uint8_t { none, bias, bias_gelu };

struct GemmArgs {
  Trans trans_a = Trans::no;
  Trans trans_b = Trans::no;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is written without being read
  // Batch strides in elements; -1 means dense (m*k, k*n, m*n). 0 broadcasts.
  int64_t stride_a = -1, stride_b = -1, stride_c = -1;
  MathMode math = MathMode::fp32;
  Epilogue epilogue = Epilogue::none;
};

// a: [batch, m, k] ([batch, k, m] if trans_a)
// b: [batch, k, n] ([batch, n, k] if trans_b)
// c: [batch, m, n]
// With strides, a/b/c hold at least (batch-1)*stride + one matrix (stride 0: one
// matrix, broadcast; C may not be broadcast).
// bias: [n] in c's dtype with Epilogue::bias / bias_gelu; undefined otherwise.
// pre (written): [m, n] in c's dtype with Epilogue::bias_gelu; undefined otherwise.
void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c, Workspace ws,
          const Tensor& bias = Tensor(), const Tensor& pre = Tensor());

// Workspace bytes gemm() needs on `device`. CPU: oneDNN's scratchpad, plus f32
// copies of f16 operands (oneDNN 2.6 has no f16 CPU matmul, so f16 is computed
// in f32). CUDA: cuBLASLt's recommended workspace (a constant, so planning
// works without a GPU); gemm() lets cuBLASLt use at most the bytes it is given.
size_t gemm_workspace_bytes(const GemmArgs& args, DType ab_dtype, DType c_dtype,
                            Device device = Device::cpu());

}  // namespace dtrain::kernels
