// The image-folder index (a sorted walk of the split's class directories) and its dataset.
#include "data/image_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "data/image_file.h"

namespace dtrain {
namespace fs = std::filesystem;

namespace {

const char* const kLayout =
    "data.path holds train/ and val/ (or test/), each with one directory of images per "
    "class (torchvision's ImageFolder layout)";

bool hidden(const fs::path& p) { return p.filename().string().starts_with('.'); }

// Sorted names of the directories in `dir` (not hidden ones: .git, .ipynb_checkpoints).
std::vector<std::string> subdirectories(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!hidden(it->path()) && it->is_directory(ec)) names.push_back(it->path().filename());
  }
  if (ec) throw Error(fmt::format("data.path: cannot list {}: {}", dir.string(), ec.message()));
  std::sort(names.begin(), names.end());
  return names;
}

// The image files under `dir` at any depth (links followed), in path order.
std::vector<fs::path> image_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec);
  for (const fs::recursive_directory_iterator end; !ec && it != end; it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (is_image_file_name(it->path()) && it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) throw Error(fmt::format("data.path: cannot list {}: {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

fs::path image_folder_split_dir(const fs::path& root, Split split) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw Error(fmt::format("data.path: {} is not a directory", root.string()), kLayout);
  const std::vector<const char*> names =
      split == Split::train ? std::vector<const char*>{"train"} : std::vector{"val", "test"};
  for (const char* name : names) {
    if (fs::is_directory(root / name, ec)) return root / name;
  }
  throw Error(fmt::format("data.path: {} has no {} directory", root.string(),
                          split == Split::train ? "train/" : "val/ or test/"),
              kLayout);
}

std::vector<std::string> image_folder_classes(const fs::path& root) {
  const fs::path dir = image_folder_split_dir(root, Split::train);
  std::vector<std::string> classes = subdirectories(dir);
  if (classes.empty())
    throw Error(fmt::format("data.path: {} holds no class directories", dir.string()), kLayout);
  return classes;
}

ImageFolderIndex index_image_folder(const fs::path& root, Split split) {
  ImageFolderIndex index;
  index.classes = image_folder_classes(root);
  index.dir = image_folder_split_dir(root, split);
  const std::vector<std::string> here =
      split == Split::train ? index.classes : subdirectories(index.dir);
  for (const std::string& name : here) {
    const auto at = std::lower_bound(index.classes.begin(), index.classes.end(), name);
    if (at == index.classes.end() || *at != name) {
      throw Error(fmt::format("data.path: {} is a class the training split ({}) does not have",
                              (index.dir / name).string(),
                              image_folder_split_dir(root, Split::train).string()),
                  "the evaluation split's class directories must be among the training split's");
    }
    const std::vector<fs::path> files = image_files(index.dir / name);
    if (files.empty() && split == Split::train) {
      throw Error(fmt::format("data.path: {} holds no image files (.png, .jpg, .jpeg, .pgm, .ppm, "
                              ".pnm)",
                              (index.dir / name).string()),
                  "every class of the training split needs images; remove the directory or "
                  "fill it");
    }
    const auto label = static_cast<int32_t>(at - index.classes.begin());
    for (const fs::path& f : files) {
      index.files.push_back(f);
      index.labels.push_back(label);
    }
  }
  if (index.files.empty()) {
    throw Error(fmt::format("data.path: {} holds no image files", index.dir.string()), kLayout);
  }
  return index;
}

ImageFolderDataset::ImageFolderDataset(ImageFolderIndex index, ImageGeometry geometry,
                                       double center_crop)
    : index_(std::move(index)), geometry_(geometry), center_crop_(center_crop) {
  DTRAIN_CHECK(index_.files.size() == index_.labels.size() && !index_.files.empty());
  DTRAIN_CHECK(center_crop > 0 && center_crop <= 1, "center crop {}", center_crop);
  DTRAIN_CHECK(geometry.classes == static_cast<int>(index_.classes.size()), "{} classes for {}",
               geometry.classes, index_.classes.size());
}

void ImageFolderDataset::read(int64_t i, float* out) const {
  DTRAIN_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  const std::vector<float> x = to_model_input(read_image_file(index_.files[static_cast<size_t>(i)]),
                                              geometry_, center_crop_);
  std::memcpy(out, x.data(), x.size() * sizeof(float));
}

void ImageFolderDataset::read_box(int64_t i, const BoxChooser& choose, float* out) const {
  DTRAIN_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  const DecodedImage image = read_image_file(index_.files[static_cast<size_t>(i)]);
  const std::vector<float> x =
      box_to_model_input(image, geometry_, choose(image.width, image.height));
  std::memcpy(out, x.data(), x.size() * sizeof(float));
}

int32_t ImageFolderDataset::label(int64_t i) const {
  DTRAIN_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  return index_.labels[static_cast<size_t>(i)];
}

std::string ImageFolderDataset::source() const {
  return fmt::format("{} ({} classes)", index_.dir.string(), index_.classes.size());
}

std::shared_ptr<const Dataset> open_image_folder(const std::string& root, Split split,
                                                 ImageGeometry geometry,
                                                 std::optional<double> center_crop) {
  ImageFolderIndex index = index_image_folder(root, split);
  const auto classes = static_cast<int>(index.classes.size());
  if (geometry.classes != classes) {
    throw Error(
        fmt::format("model.num_classes: {}, but {} holds {} class directories", geometry.classes,
                    image_folder_split_dir(root, Split::train).string(), classes),
        fmt::format("set model.num_classes: {}", classes));
  }
  return std::make_shared<ImageFolderDataset>(std::move(index), geometry,
                                              center_crop.value_or(kDefaultCenterCrop));
}

}  // namespace dtrain
