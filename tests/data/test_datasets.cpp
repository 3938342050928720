// Dataset readers: the real Fashion-MNIST (Debian's dataset-fashion-mnist), generated
// IDX files plain and gzip, generated CIFAR-10 / CIFAR-100, and the synthetic set.
#include <doctest/doctest.h>

#include <array>
#include <vector>

#include "data/dataset.h"
#include "data_files.h"

using namespace dtrain;
using namespace dtrain::test;

namespace {

std::array<int64_t, 10> histogram(const Dataset& d) {
  std::array<int64_t, 10> h{};
  for (int64_t i = 0; i < d.size(); ++i) ++h.at(static_cast<size_t>(d.label(i)));
  return h;
}

uint64_t pixel_sum(const ImageDataset& d) {
  uint64_t s = 0;
  for (int64_t i = 0; i < d.size(); ++i)
    for (int64_t k = 0; k < d.geometry().pixels(); ++k) s += d.pixels(i)[k];
  return s;
}

}  // namespace

TEST_CASE("the real Fashion-MNIST loads from its packaged path") {
  DataOptions o;
  o.dataset = DatasetName::fashion_mnist;  // no path: /usr/share/datasets/fashion-mnist
  const auto train = open_dataset(o, Split::train);
  const auto test = open_dataset(o, Split::test);
  REQUIRE(train->size() == 60000);
  REQUIRE(test->size() == 10000);
  CHECK(train->geometry().pixels() == 784);
  // The dataset is balanced: exactly 6000 train and 1000 test images per class.
  for (int64_t n : histogram(*train)) CHECK(n == 6000);
  for (int64_t n : histogram(*test)) CHECK(n == 1000);
  // First labels and the sum of all pixels, computed once from the files with Python's gzip.
  const std::vector<int32_t> first_train = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  const std::vector<int32_t> first_test = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (int i = 0; i < 10; ++i) {
    CHECK(train->label(i) == first_train[i]);
    CHECK(test->label(i) == first_test[i]);
  }
  CHECK(pixel_sum(dynamic_cast<const ImageDataset&>(*train)) == 3431114169ull);
  CHECK(pixel_sum(dynamic_cast<const ImageDataset&>(*test)) == 573469082ull);
  std::vector<float> px(784);
  train->read(0, px.data());
  CHECK(px[14 * 28 + 12] == doctest::Approx(0xed / 255.0));  // row 14: 00 00 01 04 .. ed
}

TEST_CASE("generated IDX files round-trip, plain and gzip alike") {
  for (const bool gz : {false, true}) {
    CAPTURE(gz);
    TempDir dir(gz ? "idx-gz" : "idx-plain");
    write_idx_set(dir, 30, 7, gz);
    DataOptions o;
    o.dataset = DatasetName::mnist;
    o.path = dir.str();
    const auto train = open_dataset(o, Split::train);
    const auto test = open_dataset(o, Split::test);
    REQUIRE(train->size() == 30);
    REQUIRE(test->size() == 7);
    const auto& img = dynamic_cast<const ImageDataset&>(*train);
    for (int64_t i = 0; i < 30; ++i) {
      CHECK(train->label(i) == i % 10);
      CHECK(img.pixels(i)[100] == static_cast<uint8_t>((i * 7 + 100) & 0xff));
    }
  }
}

TEST_CASE("gzip is detected by its magic, not by the file name") {
  TempDir dir("idx-magic");
  // gzip data under the plain name, plain data under the .gz name.
  write_gzip(dir.file("a"), idx_images(5));
  write_plain(dir.file("b.gz"), idx_labels(5));
  const LabeledImages d = read_idx(dir.file("a"), dir.file("b.gz"), 10);
  CHECK(d.images.shape() == Shape({5, 28, 28}));
  CHECK(d.labels.data<uint8_t>()[4] == 4);
}

TEST_CASE("CIFAR-10 batches concatenate and CIFAR-100 uses the fine label") {
  TempDir dir("cifar");
  for (int b = 1; b <= 5; ++b)
    write_plain(dir.file("data_batch_" + std::to_string(b) + ".bin"),
                cifar_records(4, 1, static_cast<uint32_t>(4 * (b - 1))));
  write_plain(dir.file("test_batch.bin"), cifar_records(3, 1));
  write_plain(dir.file("train.bin"), cifar_records(130, 2));
  write_gzip(dir.file("test.bin.gz"), cifar_records(2, 2));
  DataOptions o;
  o.path = dir.str();
  o.dataset = DatasetName::cifar10;
  const auto c10 = open_dataset(o, Split::train);
  REQUIRE(c10->size() == 20);
  CHECK(open_dataset(o, Split::test)->size() == 3);
  const auto& img = dynamic_cast<const ImageDataset&>(*c10);
  CHECK(c10->label(13) == 3);
  // Pixel (c=2, y=1, x=5) of record 13 is byte 2*1024 + 32 + 5 of its pixel block.
  CHECK(img.pixels(13)[2 * 1024 + 37] == static_cast<uint8_t>((13 + 3 * 2085) & 0xff));
  o.dataset = DatasetName::cifar100;
  const auto c100 = open_dataset(o, Split::train);
  REQUIRE(c100->size() == 130);
  CHECK(c100->label(123) == 23);  // fine = 123 % 100, coarse would be 3
  CHECK(c100->geometry().classes == 100);
  CHECK(open_dataset(o, Split::test)->size() == 2);
}

TEST_CASE("synthetic samples are a pure function of (seed, split, index)") {
  const ImageGeometry g{3, 8, 6, 7};
  const SyntheticDataset a(g, 100, 42, Split::train);
  const SyntheticDataset b(g, 100, 42, Split::train);
  const SyntheticDataset other_seed(g, 100, 43, Split::train);
  const SyntheticDataset test(g, 100, 42, Split::test);
  std::vector<float> x(144), y(144), z(144), w(144);
  a.read(17, x.data());
  b.read(17, y.data());
  other_seed.read(17, z.data());
  test.read(17, w.data());
  CHECK(x == y);
  CHECK(x != z);
  CHECK(x != w);
  a.read(18, z.data());
  CHECK(x != z);
  std::array<int, 7> seen{};
  for (int64_t i = 0; i < 100; ++i) {
    CHECK(a.label(i) == b.label(i));
    ++seen.at(static_cast<size_t>(a.label(i)));
  }
  for (int n : seen) CHECK(n > 0);
  for (float v : x) CHECK((v >= 0.0f && v < 1.0f));
}
