// Layer normalisation over the last dim of x viewed as [rows, cols]. x, y, dy and
// dx share one dtype (f32, f16, bf16); gamma, beta, dgamma and dbeta are always
// f32, whatever x's dtype (as in batch norm); statistics and all accumulation are
// f32; mean and 1/sqrt(var + eps) are saved (f32) for backward.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

struct LayerNormArgs {
  int64_t rows = 1, cols = 1;
  float eps = 1e-5f;
};

// x [rows, cols], gamma/beta f32 [cols] -> y [rows, cols], save_mean/save_rstd f32 [rows]
void layer_norm_forward(const LayerNormArgs& args, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, Tensor& y, Tensor& save_mean, Tensor& save_rstd);
// -> dx [rows, cols], dgamma/dbeta f32 [cols] (all overwritten)
void layer_norm_backward(const LayerNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta);

}  // namespace dtrain::kernels
