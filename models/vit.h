// Vision Transformer (Dosovitskiy et al. 2021) as a graph builder, laid out as
// torchvision's vit_b_16: patch embedding (patchify + linear = the stride-P
// conv), class token, learned positions, pre-LN blocks (LN -> attention -> add;
// LN -> GELU MLP -> add), final LN (eps 1e-6), linear head on the class token.
#pragma once

#include <cstdint>

#include "models/model.h"
#include "models/options.h"

namespace dtrain::models {

// input f32 [N, in_channels, image_size, image_size], labels i32 [N] -> logits
// [N, num_classes]; image_size % patch_size == 0 (else Error naming both keys).
// Init: patch projection PyTorch's conv default, class token 0, positions and
// all other weights N(0, 0.02^2) (torchvision zeroes the head; we do not, so a
// fresh model's gradients reach every layer).
ModelGraph build_vit(const ModelOptions& options, int64_t batch,
                     const graph::DTypePolicy& policy = {});

}  // namespace dtrain::models
