// Typed options of the data module: which dataset, where, the batch geometry,
// prefetching and augmentation. Plain data with defaults; src/config fills and
// checks them (including the batch divisibility rules and the per-dataset
// defaults below). No file access here.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/enum_names.h"

namespace dtrain {

// image-folder: torchvision's ImageFolder layout, data.path/train/<class>/<image files> and
// data.path/val (or test)/<class>/..., decoded as the loader reads them (data/image_folder.h).
enum class DatasetName : uint8_t {
  synthetic,
  fashion_mnist,
  mnist,
  cifar10,
  cifar100,
  tokens,
  image_folder
};
inline constexpr std::pair<DatasetName, std::string_view> kDatasetNames[] = {
    {DatasetName::synthetic, "synthetic"},
    {DatasetName::fashion_mnist, "fashion-mnist"},
    {DatasetName::mnist, "mnist"},
    {DatasetName::cifar10, "cifar10"},
    {DatasetName::cifar100, "cifar100"},
    {DatasetName::tokens, "tokens"},
    {DatasetName::image_folder, "image-folder"}};
inline std::string_view to_string(DatasetName v) { return enum_name(kDatasetNames, v); }
inline bool from_string(std::string_view text, DatasetName& out) {
  return enum_parse(kDatasetNames, text, out);
}
inline const auto& enum_names(DatasetName) { return kDatasetNames; }

// data.unreadable: what an image that cannot be decoded mid-run does (image-folder; the
// other datasets are read whole at start-up). stop: the run saves its last step and ends
// with exit 2 naming the file (docs/checkpoints.md). skip: the sample counts for nothing
// (zero pixels, the ignore label), with a warning naming the file once per rank.
enum class UnreadableAction : uint8_t { stop, skip };
inline constexpr std::pair<UnreadableAction, std::string_view> kUnreadableActionNames[] = {
    {UnreadableAction::stop, "stop"}, {UnreadableAction::skip, "skip"}};
inline std::string_view to_string(UnreadableAction v) {
  return enum_name(kUnreadableActionNames, v);
}
inline bool from_string(std::string_view text, UnreadableAction& out) {
  return enum_parse(kUnreadableActionNames, text, out);
}
inline const auto& enum_names(UnreadableAction) { return kUnreadableActionNames; }

// Shape of the samples a real dataset yields; image datasets only.
// An image dataset's geometry, and its published split sizes (what the loader holds in
// memory, u8 pixels and labels, for the run: dtrain estimate counts them).
struct DatasetShape {
  int image_size = 0;
  int channels = 0;
  int classes = 0;
  int64_t train_samples = 0, test_samples = 0;
};
inline std::optional<DatasetShape> dataset_shape(DatasetName d) {
  switch (d) {
    case DatasetName::fashion_mnist:
    case DatasetName::mnist:
      return DatasetShape{28, 1, 10, 60000, 10000};
    case DatasetName::cifar10:
      return DatasetShape{32, 3, 10, 50000, 10000};
    case DatasetName::cifar100:
      return DatasetShape{32, 3, 100, 50000, 10000};
    default:
      return std::nullopt;
  }
}

// Where Debian's packages put a dataset; only Fashion-MNIST is packaged
// (dataset-fashion-mnist). src/config fills data.path from this when absent.
inline std::optional<std::string_view> default_dataset_path(DatasetName d) {
  if (d == DatasetName::fashion_mnist) return "/usr/share/datasets/fashion-mnist";
  return std::nullopt;
}

// Training-split augmentation: random crop after zero padding by `crop_padding`
// pixels on each side, then a horizontal flip with probability 1/2. Unset
// values take the dataset's default (default_augment); the test split never augments.
// Use only the first N samples of a split (quick experiments, tests); unset: all.
struct LimitOptions {
  std::optional<int64_t> train;
  std::optional<int64_t> test;
};

// image-folder only: the training split's random resized crop (torchvision's
// RandomResizedCrop): a box of `scale` times the image's area and aspect ratio (width /
// height) in `ratio`, scaled to the model's size.
struct AugmentOptions {
  std::optional<int> crop_padding;
  std::optional<bool> flip;
  std::optional<std::array<double, 2>> scale;
  std::optional<std::array<double, 2>> ratio;
};
// CIFAR: the usual pad 4 + flip. Fashion-MNIST: pad 2 + flip (garments are
// roughly mirror-symmetric). MNIST: pad 2, no flip (a mirrored digit is another
// glyph). Synthetic: none, so throughput runs measure the bare pipeline.
inline AugmentOptions default_augment(DatasetName d) {
  switch (d) {
    case DatasetName::cifar10:
    case DatasetName::cifar100:
      return {4, true, {}, {}};
    case DatasetName::fashion_mnist:
      return {2, true, {}, {}};
    case DatasetName::mnist:
      return {2, false, {}, {}};
    case DatasetName::image_folder:
      return {0, true, std::array<double, 2>{0.08, 1.0}, std::array<double, 2>{3.0 / 4, 4.0 / 3}};
    default:
      return {0, false, {}, {}};
  }
}

inline constexpr double kDefaultCenterCrop = 0.875;  // image-folder's data.center_crop

// global_batch = micro_batch x data-parallel ranks x accumulation micro-steps.
struct DataOptions {
  DatasetName dataset = DatasetName::synthetic;
  std::optional<std::string> path;  // a directory; required but for synthetic and packaged sets
  int64_t global_batch = 32;
  int64_t micro_batch = 32;  // per rank; when absent from the job: global_batch / data ranks
  int workers = 2;           // loader threads; 0 loads in the training thread
  int prefetch = 4;          // batches each loader keeps ready ahead of the consumer
  bool shuffle = true;
  bool drop_last = true;  // false: the last batch wraps around to the epoch's start
  AugmentOptions augment;
  // image-folder only: the test split (and `dtrain predict`'s images) have their shorter
  // side scaled to model.image_size / center_crop and the middle square cut out (the
  // ImageNet evaluation's 256 -> 224 at 0.875, the default).
  std::optional<double> center_crop;
  // image-folder without val/ or test/: this share of each training class's images (spread
  // evenly through its files in path order) is the test split, the rest trains.
  std::optional<double> holdout;
  UnreadableAction unreadable = UnreadableAction::stop;
  LimitOptions limit;
  // Masked-LM (BERT) on token shards: the share of positions predicted per window
  // (then 80% [MASK], 10% a random token, 10% kept; see data/text_loader.h).
  double mlm_probability = 0.15;
};

}  // namespace dtrain
