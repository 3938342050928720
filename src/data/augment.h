// Per-sample augmentation and normalisation: random crop after zero padding, a
// horizontal flip, then (x - mean[c]) / std[c]. The draws for sample i of epoch e
// are a pure function of (seed, e, i) (Philox block i of stream (augment, 0, e)),
// so they never depend on worker count, batch position or timing. No batching here.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "data/options.h"

namespace dtrain {

enum class Flip : uint8_t { off, on };

struct ChannelStats {
  std::vector<float> mean;  // per channel, of pixels scaled to [0, 1]
  std::vector<float> std;
};
// Fashion-MNIST 0.2860 / 0.3530, MNIST 0.1307 / 0.3081, the usual CIFAR-10 and
// CIFAR-100 per-channel values; synthetic (uniform [0, 1)): 0.5 / sqrt(1/12).
ChannelStats default_normalization(DatasetName dataset, int channels);

struct AugmentConfig {
  int crop_padding = 0;  // P: pad P zero pixels each side, crop back at offset in [0, 2P]^2
  Flip flip = Flip::off;
  ChannelStats stats;  // empty: mean 0, std 1
  uint64_t seed = 0;
};

// The random choices for one sample: the crop's top-left corner in the padded
// image and whether to mirror. Block words: 0 -> oy, 1 -> ox (each mod 2P+1),
// 2 -> flip (its top bit).
struct AugmentDraw {
  int oy = 0;
  int ox = 0;
  bool flip = false;
};

class Augmenter {
 public:
  Augmenter(ImageGeometry geometry, AugmentConfig config);
  AugmentDraw draw(int64_t epoch, int64_t index) const;
  // src and dst are [C, H, W] floats (src in [0, 1]); they must not overlap.
  void apply(const float* src, float* dst, int64_t epoch, int64_t index) const;

 private:
  ImageGeometry g_;
  AugmentConfig config_;
  std::vector<float> mean_;
  std::vector<float> inv_std_;
};

}  // namespace dtrain
