// data.dataset: image-folder, torchvision's ImageFolder layout: data.path/train/<class>/...
// and data.path/val/<class>/... (or test/), one directory per class holding image files
// (PNG, JPEG, PGM/PPM; any depth below the class directory; other files are passed over).
// Classes are the training split's directory names in byte order, labels their positions;
// samples take the classes in turn (file 0 of each class, then file 1, ...), each class's
// files in path order, so that the first N (data.limit) hold every class alike. The
// images are decoded when the loader reads them, on its worker threads, and nothing but
// the file list is held.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_file.h"

namespace dtrain {

struct ImageFolderIndex {
  std::filesystem::path dir;                 // the split's directory
  std::vector<std::string> classes;          // the training split's, whichever split this is
  std::vector<std::filesystem::path> files;  // the classes in turn
  std::vector<int32_t> labels;               // by file
  std::optional<double> holdout;             // data.holdout: both splits come from train/
  bool held = false;                         // with holdout: the held-out (test) split
};

// The split's directory under root: train/, or for the test split val/ (else test/); an
// Error (exit 2) when there is none (its hint names data.holdout).
std::filesystem::path image_folder_split_dir(const std::filesystem::path& root, Split split);
// The training split's class directories, sorted; an Error when there are none.
std::vector<std::string> image_folder_classes(const std::filesystem::path& root);
// The split's samples. An Error (exit 2) names what is wrong: a missing directory, a
// training class without images, an evaluation class training does not have, images
// without class directories. With `holdout` (data.holdout, h) both splits come from
// train/: a file is held out for the test split when a 64-bit hash of its path under
// train/ is below h 2^64 (about h of each class; the file's name alone decides, so
// adding or removing files moves no other), except that a class held out whole trains
// whole; root must then have no val/ or test/, and something must be held out.
// data.holdout's draw for a file: a 64-bit hash of its path under train/
// ("cat/img001.jpg"), a pure function of the name, so adding or removing other files
// moves no file between the splits.
uint64_t image_folder_holdout_hash(const std::string& name);
ImageFolderIndex index_image_folder(const std::filesystem::path& root, Split split,
                                    std::optional<double> holdout = {});

class ImageFolderDataset final : public Dataset {
 public:
  // geometry: the model's input and class count, which must be the folder's; center_crop:
  // data.center_crop (read()).
  ImageFolderDataset(ImageFolderIndex index, ImageGeometry geometry, double center_crop);
  int64_t size() const override { return static_cast<int64_t>(index_.files.size()); }
  ImageGeometry geometry() const override { return geometry_; }
  // The whole image, its shorter side scaled to the geometry's / center_crop, the middle cut.
  void read(int64_t i, float* out) const override;
  bool reads_boxes() const override { return true; }
  void read_box(int64_t i, const BoxChooser& choose, float* out) const override;
  int32_t label(int64_t i) const override;
  std::string source() const override;
  std::vector<std::string> class_names() const override { return index_.classes; }
  std::string sample_name(int64_t i) const override {
    return index_.files[static_cast<size_t>(i)].string();
  }
  const ImageFolderIndex& index() const { return index_; }

 private:
  DecodedImage decode(int64_t i) const;  // read_image_file's, with a hint for a run
  ImageFolderIndex index_;
  ImageGeometry geometry_;
  double center_crop_;
};

// open_dataset()'s image-folder: the split of root, checked against the model's classes.
std::shared_ptr<const Dataset> open_image_folder(const std::string& root, Split split,
                                                 ImageGeometry geometry,
                                                 std::optional<double> center_crop,
                                                 std::optional<double> holdout = {});

}  // namespace dtrain
