// ResNet-18/34/50/101/152 as graph builders, layer for layer as torchvision's
// resnet.py (v1.5: a bottleneck strides on its 3x3 conv), with node names that
// mirror torchvision's state-dict keys ("layer1.0.downsample.0.weight").
// Single-device: nothing here knows of ranks, precision or compression.
#pragma once

#include <array>
#include <cstdint>

#include "models/model.h"
#include "models/options.h"

namespace dtrain::models {

enum class ResNetBlock : uint8_t { basic, bottleneck };  // expansion 1 / 4

struct ResNetDepth {
  ResNetBlock block;
  std::array<int, 4> blocks;  // residual blocks in layer1..layer4
};

inline constexpr ResNetDepth kResNet18{ResNetBlock::basic, {2, 2, 2, 2}};
inline constexpr ResNetDepth kResNet34{ResNetBlock::basic, {3, 4, 6, 3}};
inline constexpr ResNetDepth kResNet50{ResNetBlock::bottleneck, {3, 4, 6, 3}};
inline constexpr ResNetDepth kResNet101{ResNetBlock::bottleneck, {3, 4, 23, 3}};
inline constexpr ResNetDepth kResNet152{ResNetBlock::bottleneck, {3, 8, 36, 3}};

// A base channel count times options.width, rounded to the nearest integer, at least 1.
int64_t scaled_width(int64_t base, double width);

// input f32 [batch, in_channels, image_size, image_size], labels i32 [batch]
// -> logits [batch, num_classes] and the mean cross-entropy loss. Keys the
// options leave unset take the arch's preset (models/options.h).
ModelGraph build_resnet(const ResNetDepth& depth, const ModelOptions& options, int64_t batch,
                        const graph::DTypePolicy& policy = {});

}  // namespace dtrain::models
