// The image-folder dataset: its index (classes, files, the evaluation split's directory
// and every refusal), the centre crop and the box resize against hand-computed pixels,
// the random resized crop's boxes (torchvision's rule, a pure function of seed, epoch
// and sample) and the loader's batches, the same for any worker count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "data/augment.h"
#include "data/image_file.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data_files.h"
#include "image_folder_writer.h"

using namespace dtrain;
using namespace dtrain::test;
namespace fs = std::filesystem;

namespace {

DecodedImage gray(int w, int h, const std::function<uint8_t(int, int)>& value) {
  DecodedImage img;
  img.width = w;
  img.height = h;
  img.channels = 1;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) img.pixels.push_back(value(x, y));
  return img;
}

}  // namespace

TEST_CASE("an image folder's index: sorted classes and files, val or test, nothing else") {
  TempDir tmp("imgfolder-index");
  const fs::path root = tmp.str();
  write_image_folder(root, {"dog", "cat", "bird"}, {{"train", 3}, {"val", 2}});
  // What the walk passes over or takes: other files, hidden directories, nested images.
  std::ofstream(root / "train" / "cat" / "notes.txt") << "not an image";
  write_ppm(root / "train" / ".ipynb_checkpoints" / "x.ppm", 2, 2, std::vector<uint8_t>(12, 9));
  write_ppm(root / "train" / "cat" / ".hidden" / "y.ppm", 2, 2, std::vector<uint8_t>(12, 9));
  write_ppm(root / "train" / "cat" / "deeper" / "a.ppm", 2, 2, std::vector<uint8_t>(12, 9));
  // Links: back up the tree (entered once, no loop), to the same directory twice, and
  // dangling ones (passed over).
  const fs::path cat = root / "train" / "cat";
  fs::create_directory_symlink("..", cat / "up");
  fs::create_directory_symlink(".", cat / "here");
  fs::create_directory_symlink(".", cat / "again");
  fs::create_symlink(root / "nowhere.ppm", cat / "ghost.ppm");
  fs::create_symlink(root / "nowhere", root / "train" / "ghost");
  const ImageFolderIndex train = index_image_folder(root, Split::train);
  CHECK(train.classes == std::vector<std::string>{"bird", "cat", "dog"});
  CHECK(train.dir == root / "train");
  // The classes in turn, each in path order: bird 3, cat 4 (deeper/a.ppm first), dog 3.
  REQUIRE(train.files.size() == 10);
  CHECK(train.files[1] == cat / "deeper" / "a.ppm");
  CHECK(train.files[4] == cat / "img000.ppm");
  CHECK(train.files[9] == cat / "img002.ppm");
  CHECK(train.labels == std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 1});
  // The evaluation split: val/ (test/ when there is no val/), labelled by training's
  // classes even where it lacks one.
  fs::remove_all(root / "val" / "bird");
  const ImageFolderIndex val = index_image_folder(root, Split::test);
  CHECK(val.dir == root / "val");
  CHECK(val.labels == std::vector<int32_t>{1, 2, 1, 2});
  fs::rename(root / "val", root / "test");
  CHECK(index_image_folder(root, Split::test).dir == root / "test");
  // ImageNet's validation images come flat: say to sort them into class directories.
  write_ppm(root / "flat" / "val" / "ILSVRC2012_val_00000001.ppm", 2, 2,
            std::vector<uint8_t>(12, 3));
  fs::create_directory_symlink(root / "train", root / "flat" / "train");
  CHECK(has(error_of([&] { index_image_folder(root / "flat", Split::test); }),
            "val holds no class directories, but images directly"));

  // Refusals, each naming the directory at fault.
  write_ppm(root / "test" / "fox" / "f.ppm", 2, 2, std::vector<uint8_t>(12, 1));
  CHECK(has(error_of([&] { index_image_folder(root, Split::test); }),
            "test/fox is a class the training split"));
  fs::create_directories(root / "train" / "empty");
  CHECK(has(error_of([&] { index_image_folder(root, Split::train); }),
            "train/empty holds no image files"));
  fs::remove_all(root / "test");
  CHECK(has(error_of([&] { index_image_folder(root, Split::test); }), "has no val/ or test/"));
  CHECK(has(error_of([&] { index_image_folder(root / "nowhere", Split::train); }),
            "is not a directory"));
  // The model's class count must be the folder's.
  fs::remove(root / "train" / "empty");
  CHECK(has(error_of([&] {
              open_image_folder(root.string(), Split::train, {3, 8, 8, 10}, {});
            }),
            "model.num_classes: 10 (the job's, or the architecture's default where the job leaves "
            "it out), but " +
                (root / "train").string() + " holds 3 class directories"));
}

TEST_CASE("data.holdout: a share of train/ by each file's name is the test split") {
  TempDir tmp("imgfolder-holdout");
  const fs::path root = tmp.str();
  write_image_folder(root, {"a", "b"}, {{"train", 200}});
  const ImageFolderIndex test = index_image_folder(root, Split::test, 0.25);
  const ImageFolderIndex train = index_image_folder(root, Split::train, 0.25);
  CHECK(test.dir == root / "train");
  // About a quarter of each class (a binomial count: 50 +- 6.1 each), both in the test
  // split, each in path order and labelled as in training.
  const auto count = [](const ImageFolderIndex& x, int32_t label) {
    return std::count(x.labels.begin(), x.labels.end(), label);
  };
  for (int32_t k : {0, 1}) {
    CAPTURE(k);
    CHECK(count(test, k) > 25);
    CHECK(count(test, k) < 75);
    CHECK(count(test, k) + count(train, k) == 200);
  }
  std::set<fs::path> all(train.files.begin(), train.files.end());
  all.insert(test.files.begin(), test.files.end());
  CHECK(all.size() == 400);  // disjoint, and together every file
  CHECK(index_image_folder(root, Split::train).files.size() == 400);  // no holdout: all
  // A file's name alone decides: removing files (an unreadable one, say) and adding some
  // moves no other file between the splits.
  fs::remove(test.files[0]);
  fs::remove(train.files[0]);
  write_ppm(root / "train" / "a" / "extra.ppm", 2, 2, std::vector<uint8_t>(12, 5));
  const ImageFolderIndex again = index_image_folder(root, Split::test, 0.25);
  std::set<fs::path> before(test.files.begin() + 1, test.files.end());
  before.erase(root / "train" / "a" / "extra.ppm");
  std::set<fs::path> after(again.files.begin(), again.files.end());
  after.erase(root / "train" / "a" / "extra.ppm");
  CHECK(before == after);
  // A class held out whole trains whole: class c's one file, named so that its hash is
  // below 0.5 x 2^64, trains at 0.5 while a's files below it are held out.
  std::string lone;
  for (int i = 0; lone.empty(); ++i) {
    const std::string name = "c/img" + std::to_string(i) + ".ppm";
    if (image_folder_holdout_hash(name) < (uint64_t{1} << 63)) lone = name;
  }
  write_ppm(root / "mixed" / "train" / lone, 2, 2, std::vector<uint8_t>(12, 5));
  write_image_folder(root / "mixed", {"a"}, {{"train", 20}});
  const ImageFolderIndex mixed_train = index_image_folder(root / "mixed", Split::train, 0.5);
  const ImageFolderIndex mixed_test = index_image_folder(root / "mixed", Split::test, 0.5);
  CHECK(std::count(mixed_train.files.begin(), mixed_train.files.end(),
                   root / "mixed" / "train" / lone) == 1);
  for (const fs::path& f : mixed_test.files) {
    CHECK(image_folder_holdout_hash(f.lexically_relative(root / "mixed" / "train").string()) <
          (uint64_t{1} << 63));
    CHECK(f.parent_path().filename() == "a");
  }
  // The held-out split's description counts the classes it holds (a sample's name is its
  // file).
  const ImageFolderDataset mixed_set(mixed_test, ImageGeometry{3, 2, 2, 2}, 1.0);
  CHECK_MESSAGE(has(mixed_set.source(),
                    "'s data.holdout 0.5, 1 of 2 classes (the others train "
                    "whole)"),
                mixed_set.source());
  CHECK(mixed_set.sample_name(0) == mixed_test.files[0].string());
  CHECK(has(ImageFolderDataset(mixed_train, ImageGeometry{3, 2, 2, 2}, 1.0).source(),
            " less data.holdout 0.5, 2 classes"));
  // Nothing held out: refused (one file, held out whole, trains whole).
  write_image_folder(root / "tiny", {"c"}, {{"train", 1}});
  CHECK(has(error_of([&] { index_image_folder(root / "tiny", Split::test, 0.999); }),
            "data.holdout: 0.999 of " + (root / "tiny" / "train").string() +
                "'s 1 images holds none of them out: every file of 1 class(es) fell below it"));
  // Refused: an evaluation split of the folder's own.
  fs::create_directories(root / "val" / "a");
  CHECK(has(error_of([&] { index_image_folder(root, Split::train, 0.3); }),
            "data.holdout: " + root.string() + " has its own evaluation split"));
}

TEST_CASE("centre crops and box resizes read the pixels they should") {
  // 8 x 6, value 10 * x + y: a centre crop of 0.5 into 3 x 3 keeps the middle 3 x 3 of
  // the shorter side's half, pixel for pixel.
  const DecodedImage img =
      gray(8, 6, [](int x, int y) { return static_cast<uint8_t>(10 * x + y); });
  const std::vector<float> c = to_model_input(img, {1, 3, 3, 2}, 0.5);
  // The box is x in [2.5, 5.5), y in [1.5, 4.5): each output averages 2 x 2 half pixels.
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 3; ++x) {
      double sum = 0;
      for (double fy : {0.0, 1.0})
        for (double fx : {0.0, 1.0}) {
          const int sx = 2 + x + static_cast<int>(fx), sy = 1 + y + static_cast<int>(fy);
          sum += 0.25 * img.pixels[static_cast<size_t>(sy * 8 + sx)];
        }
      CHECK(c[static_cast<size_t>(y * 3 + x)] == doctest::Approx(sum / 255.0).epsilon(1e-6));
    }
  }
  // center_crop 1: the shorter side (6) to 3, the middle 6 x 6 (x from 1) averaged 2 x 2.
  const std::vector<float> plain = to_model_input(img, {1, 3, 3, 2}, 1.0);
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 3; ++x) {
      double sum = 0;
      for (int fy = 0; fy < 2; ++fy)
        for (int fx = 0; fx < 2; ++fx)
          sum += 0.25 * img.pixels[static_cast<size_t>((2 * y + fy) * 8 + 1 + 2 * x + fx)];
      CHECK(plain[static_cast<size_t>(y * 3 + x)] == doctest::Approx(sum / 255.0).epsilon(1e-6));
    }
  }
  // A box of the output's size is copied; a box stretched on one axis only repeats along it
  // and reads nothing outside the box (bilinear clamps at its edges).
  const std::vector<float> copy = box_to_model_input(img, {1, 2, 3, 2}, {4, 3, 3, 2});
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      CHECK(copy[static_cast<size_t>(y * 3 + x)] ==
            img.pixels[static_cast<size_t>((3 + y) * 8 + 4 + x)] / 255.0f);
  const std::vector<float> tall = box_to_model_input(img, {1, 4, 1, 2}, {7, 0, 1, 1});
  for (float v : tall) CHECK(v == img.pixels[7] / 255.0f);
}

TEST_CASE("random resized crops follow torchvision's rule, drawn per seed, epoch and sample") {
  AugmentConfig cfg;
  cfg.seed = 5;
  cfg.resized_crop = ResizedCrop{};
  const Augmenter aug({3, 16, 16, 10}, cfg);
  REQUIRE(aug.crops_boxes());
  std::set<std::tuple<int, int, int, int>> seen;
  int fallbacks = 0;
  for (int64_t i = 0; i < 400; ++i) {
    const ImageBox b = aug.crop_box(0, i, 300, 200);
    REQUIRE(b.x >= 0);
    REQUIRE(b.y >= 0);
    REQUIRE(b.x + b.width <= 300);
    REQUIRE(b.y + b.height <= 200);
    const double share = static_cast<double>(b.width) * b.height / (300.0 * 200.0);
    const double ratio = static_cast<double>(b.width) / b.height;
    if (b.width == 267 && b.height == 200) {  // the fallback: 3:2 cut to 4:3, centred
      ++fallbacks;
      CHECK(b.x == 16);
      continue;
    }
    // Rounding each side to whole pixels moves share and ratio a little.
    CHECK(share >= 0.08 * 0.95);
    CHECK(share <= 1.0 + 1e-9);
    CHECK(ratio >= 0.75 * 0.9);
    CHECK(ratio <= 4.0 / 3 * 1.1);
    seen.insert({b.x, b.y, b.width, b.height});
    // The same draw whenever asked; another epoch or seed draws anew.
    const ImageBox again = aug.crop_box(0, i, 300, 200);
    CHECK(std::tie(again.x, again.y, again.width, again.height) ==
          std::tie(b.x, b.y, b.width, b.height));
  }
  CHECK(seen.size() > 350);
  CHECK(fallbacks < 40);
  int moved = 0;
  for (int64_t i = 0; i < 50; ++i) {
    const ImageBox a = aug.crop_box(0, i, 300, 200), b = aug.crop_box(1, i, 300, 200);
    moved += std::tie(a.x, a.y, a.width, a.height) != std::tie(b.x, b.y, b.width, b.height);
  }
  CHECK(moved > 45);
  // An asymmetric ratio range: boxes wider than tall, never the other way round.
  AugmentConfig wider = cfg;
  wider.resized_crop = ResizedCrop{{0.2, 0.6}, {1.5, 2.0}};
  const Augmenter w_aug({3, 16, 16, 10}, wider);
  for (int64_t i = 0; i < 100; ++i) {
    const ImageBox b = w_aug.crop_box(2, i, 400, 300);
    CHECK(static_cast<double>(b.width) / b.height >= 1.5 * 0.97);
    CHECK(static_cast<double>(b.width) / b.height <= 2.0 * 1.03);
  }
  // Ranges no box can meet fall back to the whole image cut to the nearer ratio.
  AugmentConfig wide = cfg;
  wide.resized_crop = ResizedCrop{{1.0, 1.0}, {2.0, 2.0}};
  const ImageBox f = Augmenter({3, 16, 16, 10}, wide).crop_box(0, 3, 100, 100);
  CHECK(std::tie(f.x, f.y, f.width, f.height) == std::make_tuple(0, 25, 100, 50));
}

TEST_CASE("an image folder loads the same batches with any worker count") {
  TempDir tmp("imgfolder-loader");
  const fs::path root = tmp.str();
  write_image_folder(root, {"a", "b", "c"}, {{"train", 5}, {"val", 2}});
  DataOptions o;
  o.dataset = DatasetName::image_folder;
  o.path = root.string();
  o.micro_batch = 4;
  o.global_batch = 4;
  const ImageGeometry g{3, 12, 12, 3};
  const auto train = open_dataset(o, Split::train, {g, 0, 0, 0});
  REQUIRE(train->size() == 15);
  REQUIRE(train->reads_boxes());
  const auto batches = [&](int workers, Split split) {
    LoaderConfig c = make_loader_config(o, split, 7);
    c.workers = workers;
    Loader loader(split == Split::train ? train : open_dataset(o, split, {g, 0, 0, 0}), c);
    std::vector<std::vector<float>> out;
    for (int k = 0; k < 5; ++k) {
      const Batch& b = loader.next();
      const float* p = b.images.data<float>();
      out.emplace_back(p, p + b.images.numel());
    }
    return out;
  };
  const auto inline_train = batches(0, Split::train);
  CHECK(batches(2, Split::train) == inline_train);
  CHECK(batches(3, Split::test) == batches(0, Split::test));
  // Sample by sample, a training batch is the box read, flipped or not, normalised with
  // ImageNet's statistics; the test split's the centre crop at 0.875.
  const LoaderConfig c = make_loader_config(o, Split::train, 7);
  REQUIRE(c.augment.resized_crop.has_value());
  CHECK(c.augment.flip == Flip::on);
  CHECK(c.augment.stats.mean == std::vector<float>{0.485f, 0.456f, 0.406f});
  const Augmenter aug(g, c.augment);
  SamplerConfig sc;
  sc.dataset_size = train->size();
  sc.batch = 4;
  sc.seed = 7;
  Sampler sampler(sc);
  std::vector<int64_t> idx(4);
  sampler.next(idx.data());
  std::vector<float> box(static_cast<size_t>(g.pixels())), want(box.size());
  train->read_box(
      idx[1], [&](int w, int h) { return aug.crop_box(0, idx[1], w, h); }, box.data());
  aug.apply(box.data(), want.data(), 0, idx[1]);
  CHECK(std::equal(want.begin(), want.end(), inline_train[0].begin() + g.pixels()));
  std::vector<float> whole(box.size());
  train->read(0, whole.data());
  const auto* folder = dynamic_cast<const ImageFolderDataset*>(train.get());
  REQUIRE(folder != nullptr);
  CHECK(whole == to_model_input(read_image_file(folder->index().files[0]), g, 0.875));

  // Labels only (a later pipeline stage's feed): the same labels, zero images, and nothing
  // decoded, so damaged images go unread.
  const auto labels_of = [](const Batch& b) {
    return std::vector<int32_t>(b.labels.data<int32_t>(),
                                b.labels.data<int32_t>() + b.labels.numel());
  };
  std::vector<std::vector<int32_t>> want_labels;
  Loader decoding(train, make_loader_config(o, Split::train, 7));
  for (int k = 0; k < 5; ++k) want_labels.push_back(labels_of(decoding.next()));
  for (const fs::path& f : folder->index().files)
    std::ofstream(f, std::ios::binary) << "P6\n9 9\n255\nshort";
  LoaderConfig labels_only = make_loader_config(o, Split::train, 7);
  labels_only.read_images = false;
  Loader only(train, labels_only);
  for (int k = 0; k < 5; ++k) {
    const Batch& b = only.next();
    CHECK(std::all_of(b.images.data<float>(), b.images.data<float>() + b.images.numel(),
                      [](float v) { return v == 0.0f; }));
    CHECK(labels_of(b) == want_labels[static_cast<size_t>(k)]);
  }
  Loader damaged(train, make_loader_config(o, Split::train, 7));
  CHECK_THROWS_WITH_AS(
      [&] {
        for (int k = 0; k < 5; ++k) damaged.next();
      }(),
      doctest::Contains("truncated"), Error);
}
