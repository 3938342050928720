// fp64 reference scaled dot-product attention: the full [Tq, Tk] score matrix
// per (batch, head), masked, softmaxed, times V. Forward only; the kernel's
// backward is checked against finite differences of this.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace dtrain::ref {

// q [B, H, Tq, D], k/v [B, H, Tk, D], key_mask [B, Tk] (1 = attend; null: none)
// -> out [B, H, Tq, D], lse [B, H, Tq] (-inf and out = 0 for a row seeing no key)
void attention_forward(const kernels::AttentionArgs& a, const double* q, const double* k,
                       const double* v, const double* key_mask, double* out, double* lse);

}  // namespace dtrain::ref
