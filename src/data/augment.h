// Per-sample augmentation and normalisation: random crop after zero padding, a
// horizontal flip, then (x - mean[c]) / std[c]. The draws for sample i of epoch e
// are a pure function of (seed, e, i) (Philox block i of stream (augment, 0, e)),
// so they never depend on worker count, batch position or timing. No batching here.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
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
// CIFAR-100 per-channel values; synthetic (uniform [0, 1)): 0.5 / sqrt(1/12), which the
// loader does not apply (input_normalization in data/loader.h).
ChannelStats default_normalization(DatasetName dataset, int channels);

// A random resized crop's ranges (torchvision's RandomResizedCrop): the box's area as a
// share of the image's, and its aspect ratio width / height.
struct ResizedCrop {
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4, 4.0 / 3};
};

struct AugmentConfig {
  int crop_padding = 0;  // P: pad P zero pixels each side, crop back at offset in [0, 2P]^2
  Flip flip = Flip::off;
  ChannelStats stats;  // empty: mean 0, std 1
  uint64_t seed = 0;
  // Set: each sample is read as a random box of its image (Dataset::read_box), before the
  // padded crop, the flip and the normalisation.
  std::optional<ResizedCrop> resized_crop;
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
  bool crops_boxes() const { return config_.resized_crop.has_value(); }
  // The random resized crop's box for sample `index` of `epoch`, in an image width x height
  // pixels, by torchvision's rule: up to 10 tries of an area share and a log-uniform ratio
  // (block 16 * index + try: word 0 the share, 1 the ratio, 2 and 3 the corner), then the
  // whole image cut to the nearer end of the ratio range. Needs crops_boxes().
  ImageBox crop_box(int64_t epoch, int64_t index, int width, int height) const;
  // src and dst are [C, H, W] floats (src in [0, 1]); they must not overlap.
  void apply(const float* src, float* dst, int64_t epoch, int64_t index) const;

 private:
  ImageGeometry g_;
  AugmentConfig config_;
  std::vector<float> mean_;
  std::vector<float> inv_std_;
};

}  // namespace dtrain
