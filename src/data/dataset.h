// Image-classification datasets: the Dataset interface the loader reads from, the
// in-memory u8 image set that the file readers produce, the synthetic set, and
// open_dataset() which picks one from DataOptions. Token shards are not here.
// Reading a sample is const and thread-safe; nothing here shuffles or augments.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/options.h"

namespace dtrain {

enum class Split : uint8_t { train, test };

struct ImageGeometry {
  int channels = 0;
  int height = 0;
  int width = 0;
  int classes = 0;
  int64_t pixels() const { return int64_t{channels} * height * width; }
};

// A region of an image, in its pixels: x, y its top-left corner.
struct ImageBox {
  int x = 0, y = 0, width = 0, height = 0;
};
// Picks the region of an image `width` x `height` pixels to read (random resized crops).
using BoxChooser = std::function<ImageBox(int width, int height)>;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual ImageGeometry geometry() const = 0;
  // Sample i as floats in [0, 1]: out is [C, H, W] row-major, geometry().pixels() long.
  virtual void read(int64_t i, float* out) const = 0;
  // Whether samples are image files of their own sizes, which read_box can crop before
  // scaling them to the geometry (image-folder); fixed-size sets cannot.
  virtual bool reads_boxes() const { return false; }
  // Sample i's region choose(its width, its height), scaled to the geometry (each axis on
  // its own), as read() writes it. Only where reads_boxes().
  virtual void read_box(int64_t i, const BoxChooser& choose, float* out) const;
  virtual int32_t label(int64_t i) const = 0;  // in [0, classes)
  // Where the samples come from, for the run's log: the files read, or "synthetic".
  virtual std::string source() const = 0;
  // The classes' names by label where the data names them (an image folder's
  // directories); empty otherwise.
  virtual std::vector<std::string> class_names() const { return {}; }
  // Sample i's name where it has one (an image folder's file); empty otherwise.
  virtual std::string sample_name(int64_t /*i*/) const { return {}; }
};

// What the file readers return. images u8 [N, H, W] (IDX) or [N, C, H, W] (CIFAR),
// the files' own layout; labels u8 [N], already checked to be < classes.
struct LabeledImages {
  Tensor images;
  Tensor labels;
};

// Images kept in memory; geometry must match the tensors' shapes.
class ImageDataset final : public Dataset {
 public:
  ImageDataset(ImageGeometry geometry, LabeledImages data, std::string source = "memory");
  int64_t size() const override { return size_; }
  std::string source() const override { return source_; }
  ImageGeometry geometry() const override { return geometry_; }
  void read(int64_t i, float* out) const override;
  int32_t label(int64_t i) const override;
  const uint8_t* pixels(int64_t i) const;  // u8 [C, H, W]

 private:
  ImageGeometry geometry_;
  LabeledImages data_;
  int64_t size_ = 0;
  std::string source_;
};

// Uniform pixels in [0, 1) and uniform labels, a pure function of (seed, split,
// index) through Philox: any sample can be made on any thread in any order.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(ImageGeometry geometry, int64_t size, uint64_t seed, Split split);
  int64_t size() const override { return size_; }
  ImageGeometry geometry() const override { return geometry_; }
  void read(int64_t i, float* out) const override;
  int32_t label(int64_t i) const override;
  std::string source() const override { return "synthetic"; }

 private:
  uint64_t stream(int64_t i) const;
  ImageGeometry geometry_;
  int64_t size_;
  uint64_t seed_;
  Split split_;
};

// IDX (MNIST, Fashion-MNIST): one images file (magic 0x00000803, N x rows x cols)
// and one labels file (magic 0x00000801, N), plain or gzip.
LabeledImages read_idx(const std::string& images_file, const std::string& labels_file, int classes,
                       int rows = 28, int cols = 28);

// CIFAR binary: records of `label_bytes` label bytes (CIFAR-10: 1; CIFAR-100: coarse
// then fine, the fine one is used) and 3 x 32 x 32 planar pixels, files concatenated.
enum class CifarVariant : uint8_t { cifar10, cifar100 };
LabeledImages read_cifar(const std::vector<std::string>& files, CifarVariant variant);

// The file set of a dataset directory and what to tell a user who lacks it.
std::vector<std::string> dataset_files(DatasetName dataset, Split split);
std::string missing_dataset_hint(DatasetName dataset);

// Synthetic sets get their shape from the model; sizes follow CIFAR's split.
struct SyntheticSpec {
  ImageGeometry geometry{3, 32, 32, 10};
  int64_t train_size = 50000;
  int64_t test_size = 10000;
  uint64_t seed = 0;
};

// The first `n` samples of `base` (data.limit); `base` itself when n >= its size.
std::shared_ptr<const Dataset> first_samples(std::shared_ptr<const Dataset> base, int64_t n);

// Loads the split named by `options` (files under options.path, or synthetic).
std::shared_ptr<const Dataset> open_dataset(const DataOptions& options, Split split,
                                            const SyntheticSpec& synthetic = {});

}  // namespace dtrain
