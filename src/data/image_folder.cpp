// The image-folder index (a sorted walk of the split's class directories) and its dataset.
#include "data/image_folder.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "data/image_file.h"

namespace dtrain {
namespace fs = std::filesystem;

namespace {

const char* const kLayout =
    "data.path holds train/ and val/ (or test/), each with one directory of images per "
    "class (torchvision's ImageFolder layout)";

bool hidden(const fs::path& p) { return p.filename().string().starts_with('.'); }

// Whether `entry` is a directory (a link to one included); an entry that cannot be
// examined, such as a dangling link, is not.
bool is_dir(const fs::directory_entry& entry) {
  std::error_code ec;
  return entry.is_directory(ec);
}

// Sorted names of the directories in `dir` (not hidden ones: .git, .ipynb_checkpoints).
std::vector<std::string> subdirectories(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!hidden(it->path()) && is_dir(*it)) names.push_back(it->path().filename());
  }
  if (ec) throw Error(fmt::format("data.path: cannot list {}: {}", dir.string(), ec.message()));
  std::sort(names.begin(), names.end());
  return names;
}

// The device and inode of a directory (links followed), to enter each one once.
std::optional<std::pair<dev_t, ino_t>> identity(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return std::nullopt;
  return std::pair{st.st_dev, st.st_ino};
}

// The image files under `dir` at any depth, in path order. Links to directories are
// followed, but not into `dir` or a directory above it (a loop, or other classes' images)
// nor twice into one directory; entries that cannot be examined (dangling links) are
// passed over.
std::vector<fs::path> image_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::set<std::pair<dev_t, ino_t>> entered;
  std::error_code absolute;
  for (fs::path p = fs::absolute(dir, absolute); !absolute && !p.empty(); p = p.parent_path()) {
    if (const auto id = identity(p)) entered.insert(*id);
    if (p == p.parent_path()) break;
  }
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec);
  for (const fs::recursive_directory_iterator end; !ec && it != end; it.increment(ec)) {
    if (is_dir(*it)) {
      const auto id = identity(it->path());
      if (hidden(it->path()) || !id || !entered.insert(*id).second) it.disable_recursion_pending();
      continue;
    }
    std::error_code entry;
    if (!hidden(it->path()) && is_image_file_name(it->path()) && it->is_regular_file(entry))
      files.push_back(it->path());
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
  if (split == Split::train)
    throw Error(fmt::format("data.path: {} has no train/ directory", root.string()), kLayout);
  throw Error(fmt::format("data.path: {} has no val/ or test/ directory", root.string()),
              std::string(kLayout) +
                  "; or set data.holdout (e.g. 0.1) to evaluate on a share of train/'s images");
}

std::vector<std::string> image_folder_classes(const fs::path& root) {
  const fs::path dir = image_folder_split_dir(root, Split::train);
  std::vector<std::string> classes = subdirectories(dir);
  if (classes.empty())
    throw Error(fmt::format("data.path: {} holds no class directories", dir.string()), kLayout);
  return classes;
}

// 64-bit FNV-1a (offset basis 14695981039346656037, prime 1099511628211), then
// MurmurHash3's 64-bit finaliser (FNV-1a alone barely moves its high bits between names
// that differ in the last character).
uint64_t image_folder_holdout_hash(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

ImageFolderIndex index_image_folder(const fs::path& root, Split split,
                                    std::optional<double> holdout) {
  ImageFolderIndex index;
  index.classes = image_folder_classes(root);
  const bool held_split = holdout && split == Split::test;  // the files held out
  if (holdout) {
    std::error_code ec;
    for (const char* name : {"val", "test"}) {
      if (fs::is_directory(root / name, ec)) {
        throw Error(fmt::format("data.holdout: {} has its own evaluation split, {}", root.string(),
                                (root / name).string()),
                    "remove data.holdout to evaluate on it, or move the directory away");
      }
    }
    index.holdout = holdout;
    index.held = held_split;
    split = Split::train;  // both splits are cut from train/ below
  }
  index.dir = image_folder_split_dir(root, split);
  const std::vector<std::string> here =
      split == Split::train ? index.classes : subdirectories(index.dir);
  if (here.empty()) {
    throw Error(fmt::format("data.path: {} holds no class directories{}", index.dir.string(),
                            image_files(index.dir).empty() ? "" : ", but images directly"),
                "sort its images into one directory per class, named as under train/ (ImageNet's "
                "validation images come in one directory, with their classes in a separate file)");
  }
  std::vector<std::vector<fs::path>> by_class(index.classes.size());
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
    by_class[static_cast<size_t>(at - index.classes.begin())] = files;
  }
  if (holdout) {  // a file is held out by its own name alone
    const uint64_t below = static_cast<uint64_t>(std::ldexp(*holdout, 64));  // h < 1: no overflow
    size_t held = 0, all = 0, whole = 0;
    for (std::vector<fs::path>& files : by_class) {
      std::vector<char> out(files.size());
      size_t n_out = 0;
      for (size_t i = 0; i < files.size(); ++i) {
        out[i] = image_folder_holdout_hash(
                     files[i].lexically_relative(index.dir).generic_string()) < below;
        n_out += out[i] != 0 ? 1 : 0;
      }
      if (n_out == files.size()) {  // held out whole: trains whole
        std::fill(out.begin(), out.end(), 0);
        ++whole;
      }
      std::vector<fs::path> kept;
      for (size_t i = 0; i < files.size(); ++i) {
        held += out[i] != 0 ? 1 : 0;
        if ((out[i] != 0) == held_split) kept.push_back(files[i]);
      }
      all += files.size();
      files = std::move(kept);
    }
    if (held == 0 && whole > 0) {
      throw Error(fmt::format("data.holdout: {} of {}'s {} images holds none of them out: every "
                              "file of {} class(es) fell below it, and a class held out whole "
                              "trains whole",
                              *holdout, index.dir.string(), all, whole),
                  "lower data.holdout, or add a val/ directory");
    }
    if (held == 0) {
      throw Error(fmt::format("data.holdout: {} of {}'s {} images holds none of them out", *holdout,
                              index.dir.string(), all),
                  "raise data.holdout, or add a val/ directory");
    }
  }
  // Round-robin over the classes, so that the first N samples (data.limit) hold them
  // evenly.
  for (size_t round = 0;; ++round) {
    bool any = false;
    for (size_t k = 0; k < by_class.size(); ++k) {
      if (round >= by_class[k].size()) continue;
      index.files.push_back(by_class[k][round]);
      index.labels.push_back(static_cast<int32_t>(k));
      any = true;
    }
    if (!any) break;
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

DecodedImage ImageFolderDataset::decode(int64_t i) const {
  DTRAIN_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  try {
    return read_image_file(index_.files[static_cast<size_t>(i)]);
  } catch (const Error& e) {
    throw Error(e.message(),
                "replace the file with a readable image, or remove it (the folder is indexed "
                "again when a run starts or resumes)");
  }
}

void ImageFolderDataset::read(int64_t i, float* out) const {
  const std::vector<float> x = to_model_input(decode(i), geometry_, center_crop_);
  std::memcpy(out, x.data(), x.size() * sizeof(float));
}

void ImageFolderDataset::read_box(int64_t i, const BoxChooser& choose, float* out) const {
  const DecodedImage image = decode(i);
  const std::vector<float> x =
      box_to_model_input(image, geometry_, choose(image.width, image.height));
  std::memcpy(out, x.data(), x.size() * sizeof(float));
}

int32_t ImageFolderDataset::label(int64_t i) const {
  DTRAIN_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  return index_.labels[static_cast<size_t>(i)];
}

std::string ImageFolderDataset::source() const {
  if (!index_.holdout)
    return fmt::format("{} ({} classes)", index_.dir.string(), index_.classes.size());
  // A class the hash would hold out whole trains whole: the held-out split lacks it.
  const std::set<int32_t> present(index_.labels.begin(), index_.labels.end());
  const std::string classes = present.size() == index_.classes.size()
                                  ? fmt::format("{} classes", index_.classes.size())
                                  : fmt::format("{} of {} classes (the others train whole)",
                                                present.size(), index_.classes.size());
  return fmt::format("{}{} data.holdout {}, {}", index_.dir.string(), index_.held ? "'s" : " less",
                     *index_.holdout, classes);
}

std::shared_ptr<const Dataset> open_image_folder(const std::string& root, Split split,
                                                 ImageGeometry geometry,
                                                 std::optional<double> center_crop,
                                                 std::optional<double> holdout) {
  ImageFolderIndex index = index_image_folder(root, split, holdout);
  const auto classes = static_cast<int>(index.classes.size());
  if (geometry.classes != classes) {
    throw Error(
        fmt::format("model.num_classes: {} (the job's, or the architecture's default where "
                    "the job leaves it out), but {} holds {} class directories",
                    geometry.classes, image_folder_split_dir(root, Split::train).string(), classes),
        fmt::format("set model.num_classes: {}", classes));
  }
  return std::make_shared<ImageFolderDataset>(std::move(index), geometry,
                                              center_crop.value_or(kDefaultCenterCrop));
}

}  // namespace dtrain
