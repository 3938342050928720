// CIFAR-10 / CIFAR-100 binary reader. A file is a run of fixed-size records:
// label byte(s), then 3072 pixel bytes (1024 red, 1024 green, 1024 blue, each
// 32x32 row-major), so records map straight onto u8 [N, 3, 32, 32]. No format
// header exists, so a truncated file shows up as a partial last record.
#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "data/dataset.h"
#include "data/file_bytes.h"

namespace dtrain {
namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

struct Layout {
  int label_bytes;
  int fine_offset;  // which label byte is the class
  int classes;
  int coarse_classes;  // CIFAR-100's first label byte; 0 when absent
};

Layout layout_of(CifarVariant v) {
  return v == CifarVariant::cifar10 ? Layout{1, 0, 10, 0} : Layout{2, 1, 100, 20};
}

constexpr const char* kRedownload =
    "the file is damaged or not a CIFAR binary file; fetch and unpack the binary version "
    "(cifar-10-binary.tar.gz / cifar-100-binary.tar.gz) again";

int64_t count_records(const FileBytes& f, int64_t record) {
  const int64_t size = static_cast<int64_t>(f.bytes.size());
  if (size == 0) throw Error(fmt::format("{}: file is empty", f.path), kRedownload);
  if (size % record != 0)
    throw Error(fmt::format("{}: file ends inside record {} ({} of its {} bytes present)",
                            f.where(static_cast<uint64_t>(size - size % record)), size / record,
                            size % record, record),
                kRedownload);
  return size / record;
}

void check_label(const FileBytes& f, int64_t at, int64_t record, int classes, const char* what) {
  if (f.bytes[at] >= classes)
    throw Error(fmt::format("{}: {} label {} of record {} is out of range (0..{})", f.where(at),
                            what, f.bytes[at], record, classes - 1),
                kRedownload);
}

}  // namespace

LabeledImages read_cifar(const std::vector<std::string>& files, CifarVariant variant) {
  const Layout l = layout_of(variant);
  const int64_t record = l.label_bytes + kPixels;
  std::vector<FileBytes> loaded;
  int64_t total = 0;
  for (const auto& path : files) {
    loaded.push_back(read_file_bytes(path, {}));
    total += count_records(loaded.back(), record);
  }
  LabeledImages out{Tensor::empty({total, 3, 32, 32}, DType::u8),
                    Tensor::empty({total}, DType::u8)};
  uint8_t* pixels = out.images.data<uint8_t>();
  uint8_t* labels = out.labels.data<uint8_t>();
  int64_t n = 0;
  for (const auto& f : loaded) {
    for (int64_t at = 0; at < static_cast<int64_t>(f.bytes.size()); at += record, ++n) {
      const int64_t r = at / record;
      if (l.coarse_classes > 0) check_label(f, at, r, l.coarse_classes, "coarse");
      check_label(f, at + l.fine_offset, r, l.classes, l.coarse_classes > 0 ? "fine" : "class");
      labels[n] = f.bytes[at + l.fine_offset];
      std::memcpy(pixels + n * kPixels, f.bytes.data() + at + l.label_bytes, kPixels);
    }
  }
  return out;
}

}  // namespace dtrain
