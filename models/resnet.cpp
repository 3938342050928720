// ResNet graph construction. Layout per torchvision: stem (conv1, bn1, relu,
// maxpool; a batch norm followed by a ReLU is one batch_norm2d_relu node, a block's
// residual add and ReLU one add_relu node named for the ReLU), layer1..layer4 of
// residual blocks, avgpool, fc. Every conv is bias-free, Kaiming-normal with fan_out (std = sqrt(2
// / (K*R*S))) and followed by batch-norm; fc keeps PyTorch's Linear init. No numerics here: ops do
// them.
#include "models/resnet.h"

#include <cmath>

#include "graph/ops.h"

namespace dtrain::models {
namespace {

using graph::Graph;
using graph::InitKind;
using graph::ValueId;

// The keys a ResNet reads, with the CNN presets filled in where unset.
struct ResNetShape {
  int64_t classes, image, channels;
  ResNetStem stem;
  double width;
  InitKind last_gamma;  // of each block's last BN: zeros when zero_init_residual
};

ResNetShape resolve(const ModelOptions& o) {
  const ModelOptions p = preset_options(ArchPreset{o.arch, ModelFamily::cnn, 0, 0, 0});
  ResNetShape s{
      o.num_classes.value_or(*p.num_classes),
      o.image_size.value_or(*p.image_size),
      o.in_channels.value_or(*p.in_channels),
      o.stem.value_or(*p.stem),
      o.width.value_or(*p.width),
      o.zero_init_residual.value_or(*p.zero_init_residual) ? InitKind::zeros : InitKind::ones};
  if (!(s.width > 0) || !std::isfinite(s.width)) {
    throw Error(fmt::format("model.width: {} is not a positive channel multiplier", s.width),
                "e.g. width: 0.5 halves every layer");
  }
  for (auto [key, v] : {std::pair{"num_classes", s.classes}, std::pair{"image_size", s.image},
                        std::pair{"in_channels", s.channels}}) {
    if (v <= 0) throw Error(fmt::format("model.{}: expected a positive integer, got {}", key, v));
  }
  return s;
}

enum class Relu : uint8_t { no, yes };

// conv (no bias, pad k/2) then batch-norm, and ReLU with Relu::yes (fused into the
// batch-norm node, named as it: graph::batch_norm2d_relu); returns the last output.
ValueId conv_bn(Graph& g, const std::string& conv, const std::string& bn, ValueId x, int64_t cin,
                int64_t cout, int64_t kernel, int64_t stride, Relu relu,
                InitKind gamma = InitKind::ones) {
  const ValueId y = g.add1(conv,
                           graph::conv2d(cin, cout, kernel, stride, kernel / 2, 1, 1,
                                         graph::Bias::no, graph::KaimingFan::out),
                           {x});
  return g.add1(bn,
                relu == Relu::yes ? graph::batch_norm2d_relu(cout, 1e-5f, 0.1f, gamma)
                                  : graph::batch_norm2d(cout, 1e-5f, 0.1f, gamma),
                {y});
}

struct BlockShape {
  int64_t in, planes, stride;  // output channels: planes x expansion
};

// relu(branch + shortcut); the shortcut is 1x1 conv/stride + BN when the shape changes.
ValueId join(Graph& g, const std::string& p, ValueId x, ValueId branch, const BlockShape& s,
             int64_t out) {
  ValueId shortcut = x;
  if (s.stride != 1 || s.in != out) {
    shortcut =
        conv_bn(g, p + "downsample.0", p + "downsample.1", x, s.in, out, 1, s.stride, Relu::no);
  }
  return g.add1(p + "relu", graph::add_relu(), {branch, shortcut});  // add and ReLU: one node
}

// 3x3 (stride) -> 3x3, expansion 1.
ValueId basic_block(Graph& g, const std::string& p, ValueId x, const BlockShape& s,
                    InitKind last_gamma) {
  ValueId h = conv_bn(g, p + "conv1", p + "bn1", x, s.in, s.planes, 3, s.stride, Relu::yes);
  h = conv_bn(g, p + "conv2", p + "bn2", h, s.planes, s.planes, 3, 1, Relu::no, last_gamma);
  return join(g, p, x, h, s, s.planes);
}

// 1x1 -> 3x3 (stride, the v1.5 placement) -> 1x1 up to 4 x planes.
ValueId bottleneck_block(Graph& g, const std::string& p, ValueId x, const BlockShape& s,
                         InitKind last_gamma) {
  ValueId h = conv_bn(g, p + "conv1", p + "bn1", x, s.in, s.planes, 1, 1, Relu::yes);
  h = conv_bn(g, p + "conv2", p + "bn2", h, s.planes, s.planes, 3, s.stride, Relu::yes);
  h = conv_bn(g, p + "conv3", p + "bn3", h, s.planes, 4 * s.planes, 1, 1, Relu::no, last_gamma);
  return join(g, p, x, h, s, 4 * s.planes);
}

// x [N, C, H, W] -> [N, stem width, H/4, W/4] (standard) or [N, stem width, H, W] (small).
ValueId stem(Graph& g, ValueId x, const ResNetShape& s, int64_t out) {
  const bool small = s.stem == ResNetStem::small;
  ValueId h =
      conv_bn(g, "conv1", "bn1", x, s.channels, out, small ? 3 : 7, small ? 1 : 2, Relu::yes);
  if (small) return h;
  return g.add1("maxpool", graph::pool2d(kernels::PoolKind::max, 3, 2, 1), {h});
}

}  // namespace

int64_t scaled_width(int64_t base, double width) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(base) * width));
}

ModelGraph build_resnet(const ResNetDepth& depth, const ModelOptions& options, int64_t batch,
                        const graph::DTypePolicy& policy) {
  const ResNetShape s = resolve(options);
  ModelGraph m;
  Graph& g = m.graph;
  g.set_policy(policy);
  m.input = g.input("input", {batch, s.channels, s.image, s.image}, DType::f32);
  m.labels = g.input("labels", {batch}, DType::i32);
  const int64_t expansion = depth.block == ResNetBlock::basic ? 1 : 4;
  int64_t channels = scaled_width(64, s.width);
  const ValueId x =
      policy.half() ? g.add1("to_compute", graph::to_compute_dtype(), {m.input}) : m.input;
  ValueId h = stem(g, x, s, channels);
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t planes = scaled_width(int64_t{64} << layer, s.width);
    for (int b = 0; b < depth.blocks[static_cast<size_t>(layer)]; ++b) {
      const std::string prefix = fmt::format("layer{}.{}.", layer + 1, b);
      const BlockShape shape{channels, planes, b == 0 && layer > 0 ? 2 : 1};
      g.begin_block();  // a residual block: the unit activation checkpointing recomputes
      h = depth.block == ResNetBlock::basic ? basic_block(g, prefix, h, shape, s.last_gamma)
                                            : bottleneck_block(g, prefix, h, shape, s.last_gamma);
      g.end_block();
      channels = planes * expansion;
    }
  }
  h = g.add1("avgpool", graph::global_avg_pool(), {h});  // [N, channels]
  m.logits = g.add1("fc", graph::linear(channels, s.classes, graph::Bias::yes), {h});
  m.loss = g.add1("loss",
                  graph::softmax_cross_entropy(-100, static_cast<float>(options.label_smoothing)),
                  {m.logits, m.labels});
  return m;
}

}  // namespace dtrain::models
