// The in-memory and synthetic datasets, the per-dataset file lists and hints, and
// open_dataset(). File parsing lives in idx.cpp and cifar.cpp.
#include "data/dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/file_bytes.h"
#include "data/image_folder.h"
#include "data/rng_streams.h"

namespace dtrain {

ImageDataset::ImageDataset(ImageGeometry geometry, LabeledImages data, std::string source)
    : geometry_(geometry),
      data_(std::move(data)),
      size_(data_.labels.numel()),
      source_(std::move(source)) {
  DTRAIN_CHECK(data_.images.dtype() == DType::u8 && data_.labels.dtype() == DType::u8);
  DTRAIN_CHECK(data_.images.numel() == size_ * geometry_.pixels(), "{} images for {} labels",
               data_.images.str(), size_);
  if (size_ == 0)
    throw Error("the dataset holds no samples", "check data.path and the dataset's files");
}

const uint8_t* ImageDataset::pixels(int64_t i) const {
  DTRAIN_CHECK(i >= 0 && i < size_, "sample {} of {}", i, size_);
  return data_.images.data<uint8_t>() + i * geometry_.pixels();
}

void ImageDataset::read(int64_t i, float* out) const {
  const uint8_t* p = pixels(i);
  const int64_t n = geometry_.pixels();
  for (int64_t k = 0; k < n; ++k) out[k] = static_cast<float>(p[k]) * (1.0f / 255.0f);
}

int32_t ImageDataset::label(int64_t i) const {
  DTRAIN_CHECK(i >= 0 && i < size_, "sample {} of {}", i, size_);
  return data_.labels.data<uint8_t>()[i];
}

void Dataset::read_box(int64_t, const BoxChooser&, float*) const {
  DTRAIN_CHECK(false, "{} holds images of one size: no boxes to crop", source());
}

SyntheticDataset::SyntheticDataset(ImageGeometry geometry, int64_t size, uint64_t seed, Split split)
    : geometry_(geometry), size_(size), seed_(seed), split_(split) {
  DTRAIN_CHECK(size > 0 && geometry.pixels() > 0 && geometry.classes > 0);
}

uint64_t SyntheticDataset::stream(int64_t i) const {
  return rng_stream_id(data_rng::kSynthetic, static_cast<uint32_t>(split_),
                       static_cast<uint64_t>(i));
}

// Block 0 of the sample's stream draws the label; blocks 1.. the pixels, 4 each.
void SyntheticDataset::read(int64_t i, float* out) const {
  DTRAIN_CHECK(i >= 0 && i < size_, "sample {} of {}", i, size_);
  const Philox rng(seed_, stream(i));
  const int64_t n = geometry_.pixels();
  for (int64_t k = 0; k < n; k += 4) {
    const PhiloxCounter words = rng.block(1 + static_cast<uint64_t>(k / 4));
    for (int64_t j = 0; j < 4 && k + j < n; ++j) out[k + j] = u32_to_uniform(words[j]);
  }
}

int32_t SyntheticDataset::label(int64_t i) const {
  DTRAIN_CHECK(i >= 0 && i < size_, "sample {} of {}", i, size_);
  return static_cast<int32_t>(Philox(seed_, stream(i)).block(0)[0] %
                              static_cast<uint32_t>(geometry_.classes));
}

std::vector<std::string> dataset_files(DatasetName dataset, Split split) {
  const bool train = split == Split::train;
  switch (dataset) {
    case DatasetName::fashion_mnist:
    case DatasetName::mnist:
      if (train) return {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};
      return {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    case DatasetName::cifar10:
      if (train)
        return {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                "data_batch_5.bin"};
      return {"test_batch.bin"};
    case DatasetName::cifar100:
      return {train ? "train.bin" : "test.bin"};
    default:
      return {};
  }
}

std::string missing_dataset_hint(DatasetName dataset) {
  switch (dataset) {
    case DatasetName::fashion_mnist:
      return "apt-get install dataset-fashion-mnist (it puts the files in "
             "/usr/share/datasets/fashion-mnist), or set data.path to a directory holding them";
    case DatasetName::mnist:
      return "put the four MNIST IDX files (train-images-idx3-ubyte.gz, ..., from the MNIST "
             "distribution or a mirror) in one directory and set data.path to it";
    case DatasetName::cifar10:
      return "download cifar-10-binary.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html), "
             "unpack it and set data.path to its cifar-10-batches-bin directory";
    case DatasetName::cifar100:
      return "download cifar-100-binary.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html), "
             "unpack it and set data.path to its cifar-100-binary directory";
    case DatasetName::image_folder:
      return "set data.path to a directory holding train/ and val/ (or test/), each with a "
             "directory of image files (PNG, JPEG, PGM/PPM) per class, as torchvision's "
             "ImageFolder reads them";
    default:
      return "set data.path to the dataset's directory";
  }
}

namespace {

std::shared_ptr<const Dataset> open_files(DatasetName dataset, const std::string& dir,
                                          Split split) {
  const DatasetShape shape = *dataset_shape(dataset);
  const ImageGeometry g{shape.channels, shape.image_size, shape.image_size, shape.classes};
  const std::string hint = missing_dataset_hint(dataset);
  std::vector<std::string> paths;
  for (const auto& name : dataset_files(dataset, split))
    paths.push_back(find_data_file(dir, name, hint));
  if (dataset == DatasetName::cifar10 || dataset == DatasetName::cifar100) {
    const auto v = dataset == DatasetName::cifar10 ? CifarVariant::cifar10 : CifarVariant::cifar100;
    return std::make_shared<ImageDataset>(g, read_cifar(paths, v),
                                          fmt::format("{}", fmt::join(paths, ", ")));
  }
  LabeledImages d = read_idx(paths[0], paths[1], g.classes, g.height, g.width);
  d.images = d.images.reshape({d.labels.numel(), 1, g.height, g.width});
  return std::make_shared<ImageDataset>(g, std::move(d), fmt::format("{}", fmt::join(paths, ", ")));
}

}  // namespace

std::shared_ptr<const Dataset> open_dataset(const DataOptions& options, Split split,
                                            const SyntheticSpec& synthetic) {
  const DatasetName d = options.dataset;
  if (d == DatasetName::synthetic) {
    const int64_t n = split == Split::train ? synthetic.train_size : synthetic.test_size;
    return std::make_shared<SyntheticDataset>(synthetic.geometry, n, synthetic.seed, split);
  }
  if (d == DatasetName::image_folder) {
    if (!options.path)
      throw Error("data.path: dataset image-folder needs data.path", missing_dataset_hint(d));
    return open_image_folder(*options.path, split, synthetic.geometry, options.center_crop,
                             options.holdout);
  }
  if (!dataset_shape(d))
    throw Error(fmt::format("data.dataset: {} is not an image dataset", to_string(d)),
                "token shards are read by the language-model data path, not open_dataset()");
  std::optional<std::string> dir = options.path;
  if (!dir) {
    if (auto packaged = default_dataset_path(d)) dir = std::string(*packaged);
  }
  if (!dir)
    throw Error(fmt::format("data.path: dataset {} needs data.path", to_string(d)),
                missing_dataset_hint(d));
  return open_files(d, *dir, split);
}

namespace {

class FirstSamples final : public Dataset {
 public:
  FirstSamples(std::shared_ptr<const Dataset> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  ImageGeometry geometry() const override { return base_->geometry(); }
  void read(int64_t i, float* out) const override { base_->read(i, out); }
  bool reads_boxes() const override { return base_->reads_boxes(); }
  void read_box(int64_t i, const BoxChooser& choose, float* out) const override {
    base_->read_box(i, choose, out);
  }
  int32_t label(int64_t i) const override { return base_->label(i); }
  std::vector<std::string> class_names() const override { return base_->class_names(); }
  std::string sample_name(int64_t i) const override { return base_->sample_name(i); }
  std::string source() const override {
    return fmt::format("the first {} of {} in {}", n_, base_->size(), base_->source());
  }

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t n_;
};

}  // namespace

std::shared_ptr<const Dataset> first_samples(std::shared_ptr<const Dataset> base, int64_t n) {
  if (n >= base->size()) return base;
  return std::make_shared<FirstSamples>(std::move(base), n);
}

}  // namespace dtrain
