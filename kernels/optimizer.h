// Fused optimizer steps over one contiguous range of flat buffers (a segment
// chunk of src/optim): parameters and state in place, the step's scalars computed
// by the caller in double and rounded once to f32. One pass does what a
// mixed-precision step needs: the gradient is read as g x gscale (the loss-scale
// unscale and the clipping factor, folded by the caller; 1 reads g as it is), the
// parameter is updated in f32, and, when `copy` is given, also written rounded to
// copy's dtype (the compute-dtype parameters of fp32 master weights). Parameters
// may themselves be f16 or bf16 (master_weights: false): read widened, updated in
// f32, written rounded to nearest even. Gradients and optimizer state are f32.
// SGD (PyTorch semantics, dampening 0): d = g + wd p; b = mu b + d; d = d + mu b
// (Nesterov) or b; p -= lr d. AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p = p (1 - lr wd) - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
// LAMB: two passes over a table of chunks (below), with the per-segment trust
// ratios computed by the caller in between.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class SgdMomentum : uint8_t { none, heavy_ball, nesterov };

struct SgdStep {
  float lr = 0.0f, wd = 0.0f, mu = 0.0f;
  SgdMomentum momentum = SgdMomentum::none;
  float gscale = 1.0f;  // g is read as g x gscale
};

struct AdamStep {
  float b1 = 0.9f, one_minus_b1 = 0.1f, b2 = 0.999f, one_minus_b2 = 0.001f;
  float bc1 = 1.0f, sqrt_bc2 = 1.0f;  // 1 - b1^t and sqrt(1 - b2^t), t counted from 1
  float eps = 1e-8f, lr = 0.0f, wd = 0.0f;
  float gscale = 1.0f;  // g is read as g x gscale
};

// p [n] f32, f16 or bf16; g, momentum [n] f32 (momentum undefined with
// SgdMomentum::none); copy: nullptr, or [n] f32 / f16 / bf16 receiving the new p.
void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum,
              Tensor* copy = nullptr);
// p [n] f32, f16 or bf16; g, m, v [n] f32; copy as for sgd_step.
void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                Tensor* copy = nullptr);

// The exponential moving average of the weights (optimizer.ema): p and ema [n] f32,
// ema += rest * (p - ema), rest = 1 - decay rounded once by the caller: the lerp form,
// which stays exactly on weights that no longer move and approaches them alike from
// either side (decay * ema + rest * p, its two factors rounded apart, can drift off
// them). Either way the average is f32: a step below half a unit in the last place of
// ema vanishes, so approaching still weights it stalls about ulp(ema) / (2 rest) away
// (measured: 0.004% at decay 0.999, 0.04% at 0.9999, 0.4% at 0.99999).
void ema_update(float rest, const Tensor& p, Tensor& ema);

// LAMB over whole flat buffers p, g, m, v (f32 [N]; g read as g x k.gscale) cut
// into a fixed chunk table (no copy: the caller writes the compute-dtype copy):
// ranges i64 [C, 2] (begin, end: elements into the buffers) and wd f32 [C] (the
// chunk's weight decay; k.wd is not read). One CPU task or one CUDA block per
// chunk, so each chunk's sums depend on the layout alone, never on thread counts.
//   u = (m / bc1) / (sqrt(v) / sqrt_bc2 + eps) + wd p
// lamb_moments: m, v updated from g; sums f64 [C, 2] = (sum p^2, sum u^2) per chunk,
//   in double, over tiles of kLambTile elements added in tile order.
// lamb_update: p -= step[c] u, u recomputed bit-identically from (p, m, v); step f32 [C]
//   is lr times the trust ratio of the chunk's segment (k.lr is not read).
// Every tensor on one device; ranges must lie inside [0, N) (checked on the CPU only:
// on CUDA the table is the caller's, built once from checked segments).
inline constexpr int64_t kLambTile = 256;
void lamb_moments(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& p,
                  const Tensor& g, Tensor& m, Tensor& v, Tensor& sums);
void lamb_update(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& step,
                 Tensor& p, const Tensor& m, const Tensor& v);

}  // namespace dtrain::kernels
