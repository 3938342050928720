// Fused optimizer steps over one contiguous range of flat f32 buffers (a
// segment chunk of src/optim): parameters, gradients and state in place, the
// step's scalars computed by the caller in double and rounded once to f32.
// SGD (PyTorch semantics, dampening 0): d = g + wd p; b = mu b + d; d = d + mu b
// (Nesterov) or b; p -= lr d. AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p = p (1 - lr wd) - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps). LAMB's two
// passes stay in src/optim for now (host only).
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class SgdMomentum : uint8_t { none, heavy_ball, nesterov };

struct SgdStep {
  float lr = 0.0f, wd = 0.0f, mu = 0.0f;
  SgdMomentum momentum = SgdMomentum::none;
};

struct AdamStep {
  float b1 = 0.9f, one_minus_b1 = 0.1f, b2 = 0.999f, one_minus_b2 = 0.001f;
  float bc1 = 1.0f, sqrt_bc2 = 1.0f;  // 1 - b1^t and sqrt(1 - b2^t), t counted from 1
  float eps = 1e-8f, lr = 0.0f, wd = 0.0f;
};

// p, g, momentum [n] f32 (momentum undefined with SgdMomentum::none)
void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum);
// p, g, m, v [n] f32
void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v);

}  // namespace dtrain::kernels
