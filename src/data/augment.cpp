// Crop + flip + normalise in one gather pass: output pixel (c, y, x) reads source
// pixel (y + oy - P, x' + ox - P) with x' = W-1-x when mirrored, else x; reads
// outside the image are the zero padding (black, before normalisation).
#include "data/augment.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "data/rng_streams.h"

namespace dtrain {

ChannelStats default_normalization(DatasetName dataset, int channels) {
  switch (dataset) {
    case DatasetName::fashion_mnist:
      return {{0.2860f}, {0.3530f}};
    case DatasetName::mnist:
      return {{0.1307f}, {0.3081f}};
    case DatasetName::cifar10:
      return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
    case DatasetName::cifar100:
      return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
    case DatasetName::image_folder:  // ImageNet's (as torchvision's pretrained models use)
      if (channels == 1) return {{0.449f}, {0.226f}};
      return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
    default: {
      const auto c = static_cast<size_t>(channels);
      return {std::vector<float>(c, 0.5f), std::vector<float>(c, std::sqrt(1.0f / 12.0f))};
    }
  }
}

Augmenter::Augmenter(ImageGeometry geometry, AugmentConfig config)
    : g_(geometry), config_(std::move(config)) {
  const auto c = static_cast<size_t>(g_.channels);
  DTRAIN_CHECK(config_.crop_padding >= 0, "crop padding {}", config_.crop_padding);
  const ChannelStats& s = config_.stats;
  DTRAIN_CHECK(s.mean.empty() || (s.mean.size() == c && s.std.size() == c),
               "{} means, {} stds for {} channels", s.mean.size(), s.std.size(), c);
  mean_.assign(c, 0.0f);
  inv_std_.assign(c, 1.0f);
  for (size_t i = 0; i < s.mean.size(); ++i) {
    DTRAIN_CHECK(s.std[i] > 0, "std of channel {} is {}", i, s.std[i]);
    mean_[i] = s.mean[i];
    inv_std_[i] = 1.0f / s.std[i];
  }
}

AugmentDraw Augmenter::draw(int64_t epoch, int64_t index) const {
  const int p = config_.crop_padding;
  if (p == 0 && config_.flip == Flip::off) return {};
  const Philox rng(config_.seed,
                   rng_stream_id(data_rng::kAugment, 0, static_cast<uint64_t>(epoch)));
  const PhiloxCounter w = rng.block(static_cast<uint64_t>(index));
  const auto span = static_cast<uint32_t>(2 * p + 1);
  AugmentDraw d;
  d.oy = static_cast<int>(w[0] % span);
  d.ox = static_cast<int>(w[1] % span);
  d.flip = config_.flip == Flip::on && (w[2] >> 31) != 0;
  return d;
}

ImageBox Augmenter::crop_box(int64_t epoch, int64_t index, int width, int height) const {
  DTRAIN_CHECK(config_.resized_crop && width >= 1 && height >= 1 && index >= 0);
  const ResizedCrop& rc = *config_.resized_crop;
  const Philox rng(config_.seed,
                   rng_stream_id(data_rng::kResizedCrop, 0, static_cast<uint64_t>(epoch)));
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(rc.ratio[0]), log_hi = std::log(rc.ratio[1]);
  const auto unit = [](uint32_t w) { return static_cast<double>(w) * 0x1p-32; };  // [0, 1)
  for (uint64_t t = 0; t < 10; ++t) {
    const PhiloxCounter r = rng.block(static_cast<uint64_t>(index) << 4 | t);
    const double target = area * (rc.scale[0] + (rc.scale[1] - rc.scale[0]) * unit(r[0]));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * unit(r[1]));
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target / aspect)));
    if (w < 1 || w > width || h < 1 || h > height) continue;
    const auto y = static_cast<int>(r[2] % static_cast<uint32_t>(height - h + 1));
    const auto x = static_cast<int>(r[3] % static_cast<uint32_t>(width - w + 1));
    return {x, y, static_cast<int>(w), static_cast<int>(h)};
  }
  int w = width, h = height;
  const double in_ratio = static_cast<double>(width) / height;
  if (in_ratio < rc.ratio[0]) {
    h = std::clamp(static_cast<int>(std::lround(width / rc.ratio[0])), 1, height);
  } else if (in_ratio > rc.ratio[1]) {
    w = std::clamp(static_cast<int>(std::lround(height * rc.ratio[1])), 1, width);
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

void Augmenter::apply(const float* src, float* dst, int64_t epoch, int64_t index) const {
  const AugmentDraw d = draw(epoch, index);
  const int p = config_.crop_padding;
  const int h = g_.height;
  const int w = g_.width;
  for (int c = 0; c < g_.channels; ++c) {
    const float m = mean_[c];
    const float s = inv_std_[c];
    const float* plane = src + static_cast<int64_t>(c) * h * w;
    float* out = dst + static_cast<int64_t>(c) * h * w;
    for (int y = 0; y < h; ++y) {
      const int sy = y + d.oy - p;
      const bool row_in = sy >= 0 && sy < h;
      for (int x = 0; x < w; ++x) {
        const int sx = (d.flip ? w - 1 - x : x) + d.ox - p;
        const float v = row_in && sx >= 0 && sx < w ? plane[sy * w + sx] : 0.0f;
        out[y * w + x] = (v - m) * s;
      }
    }
  }
}

}  // namespace dtrain
