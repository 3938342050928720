// Layout changes: permute the dims of a contiguous tensor (rank <= 6), e.g.
// [B, T, 3, H, D] -> [3, B, H, T, D] to split attention heads. Any dtype.
#pragma once

#include <span>

#include "kernels/common.h"

namespace dtrain::kernels {

// y.shape[i] == x.shape[perm[i]]; y is fully overwritten.
void permute(const Tensor& x, std::span<const int> perm, Tensor& y);

}  // namespace dtrain::kernels
