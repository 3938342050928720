// Batch normalisation over N and the spatial dims, per channel, for x viewed as
// [N, C, HW]. Training uses batch statistics, updates running stats in place
// (running_var gets the unbiased variance, as PyTorch does) and saves mean and
// 1/sqrt(var + eps) for backward. x, y, dx: f32, f16 or bf16; everything else f32.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

struct BatchNormArgs {
  int64_t n = 1, c = 1, hw = 1;
  float eps = 1e-5f;
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch
  // 0: x, y, dy, dx are [N, C, HW]; B (8 or 16, f32 or bf16 on the CPU): channel-blocked
  // [N, C/B, HW, B], C a multiple of B. The same bits either way.
  int64_t block = 0;
  // y = max(batch_norm(x), 0), the ReLU fused (f32 or bf16 on the CPU): forward writes the
  // ReLU's output, backward reads it (relu_y) and takes dy where it is > 0, else 0. The
  // bits of batch norm then ReLU as two ops, without the pre-activation in memory.
  bool relu = false;
};

// x [N, C, HW] -> y; gamma, beta [C]; running_mean/var [C] (updated); save_mean, save_invstd [C]
void batch_norm_forward_train(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, Tensor& y, Tensor& running_mean,
                              Tensor& running_var, Tensor& save_mean, Tensor& save_invstd);
// y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta
void batch_norm_forward_infer(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, const Tensor& running_mean,
                              const Tensor& running_var, Tensor& y);
// -> dx [N, C, HW], dgamma, dbeta [C] (all overwritten); relu_y: forward's y, with relu
void batch_norm_backward(const BatchNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                         const Tensor& relu_y = Tensor());

}  // namespace dtrain::kernels
