// Augmentation: draws depend only on (seed, epoch, index); crop and flip move
// pixels as specified; normalisation uses the channel statistics.
#include <doctest/doctest.h>

#include <vector>

#include "data/augment.h"

using namespace dtrain;

namespace {

const ImageGeometry kG{2, 6, 5, 10};

// Pixel (c, y, x) = (c*100 + y*10 + x + 1) / 1000: distinct and non-zero.
std::vector<float> ramp() {
  std::vector<float> v(60);
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 5; ++x) v[c * 30 + y * 5 + x] = (c * 100 + y * 10 + x + 1) / 1000.0f;
  return v;
}

std::vector<float> run(const Augmenter& a, int64_t epoch, int64_t index) {
  std::vector<float> out(60);
  a.apply(ramp().data(), out.data(), epoch, index);
  return out;
}

}  // namespace

TEST_CASE("augmentation draws are a pure function of (seed, epoch, index)") {
  AugmentConfig c{2, Flip::on, {}, 5, {}};
  const Augmenter a(kG, c), b(kG, c);
  CHECK(run(a, 3, 17) == run(b, 3, 17));
  int differ_index = 0, differ_epoch = 0, flips = 0;
  for (int64_t i = 0; i < 64; ++i) {
    differ_index += run(a, 3, i) != run(a, 3, i + 1);
    differ_epoch += run(a, 3, i) != run(a, 4, i);
    flips += a.draw(3, i).flip;
    CHECK(a.draw(3, i).oy <= 4);
  }
  CHECK(differ_index > 50);
  CHECK(differ_epoch > 50);
  CHECK(flips > 16);
  CHECK(flips < 48);
  c.seed = 6;
  const Augmenter other(kG, c);
  int differ_seed = 0;
  for (int64_t i = 0; i < 64; ++i) differ_seed += run(a, 3, i) != run(other, 3, i);
  CHECK(differ_seed > 50);
}

TEST_CASE("flip mirrors, crop shifts in zero padding, normalisation is per channel") {
  const AugmentConfig flip_only{0, Flip::on, {}, 1, {}};
  const Augmenter f(kG, flip_only);
  int64_t flipped = -1;
  for (int64_t i = 0; i < 16 && flipped < 0; ++i)
    if (f.draw(0, i).flip) flipped = i;
  REQUIRE(flipped >= 0);
  const auto in = ramp();
  const auto m = run(f, 0, flipped);
  CHECK(m != in);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 5; ++x) CHECK(m[30 + y * 5 + x] == in[30 + y * 5 + (4 - x)]);

  const Augmenter crop(kG, {3, Flip::off, {}, 2, {}});
  int64_t moved = -1;
  for (int64_t i = 0; i < 16 && moved < 0; ++i)
    if (crop.draw(1, i).oy != 3 && crop.draw(1, i).ox != 3) moved = i;
  REQUIRE(moved >= 0);
  const AugmentDraw d = crop.draw(1, moved);
  const auto out = run(crop, 1, moved);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 5; ++x) {
      const int sy = y + d.oy - 3, sx = x + d.ox - 3;
      const bool in_image = sy >= 0 && sy < 6 && sx >= 0 && sx < 5;
      CHECK(out[y * 5 + x] == (in_image ? in[sy * 5 + sx] : 0.0f));
    }
  CHECK(out != in);

  const Augmenter norm(kG, {0, Flip::off, {{0.5f, 0.25f}, {2.0f, 0.5f}}, 0, {}});
  const auto n = run(norm, 0, 0);
  CHECK(n[7] == doctest::Approx((in[7] - 0.5f) / 2.0f));
  CHECK(n[37] == doctest::Approx((in[37] - 0.25f) / 0.5f));
}

TEST_CASE("default normalisation statistics") {
  const ChannelStats f = default_normalization(DatasetName::fashion_mnist, 1);
  CHECK(f.mean == std::vector<float>{0.2860f});
  CHECK(f.std == std::vector<float>{0.3530f});
  CHECK(default_normalization(DatasetName::cifar10, 3).mean.size() == 3);
  CHECK(default_normalization(DatasetName::synthetic, 4).std.size() == 4);
}
