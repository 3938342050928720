// IDX reader (the MNIST file format): a big-endian header of magic 00 00 08 NDIM
// (08: unsigned bytes) and NDIM u32 sizes, then the payload row-major. Every
// departure from what MNIST / Fashion-MNIST ship is a dtrain::Error naming the
// file, the byte offset, and what to do. No shuffling or conversion here.
#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "data/dataset.h"
#include "data/file_bytes.h"

namespace dtrain {
namespace {

constexpr const char* kRedownload =
    "the file is damaged or not an MNIST-style IDX file; fetch it again (for Fashion-MNIST: "
    "apt-get install --reinstall dataset-fashion-mnist)";

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

struct IdxHeader {
  std::vector<int64_t> dims;
  size_t payload_offset = 0;
};

// Checks magic, header length and the sample dims against `expect` (dims after N).
IdxHeader parse_header(const FileBytes& f, const std::vector<int64_t>& expect) {
  const size_t ndims = expect.size() + 1;
  const size_t size = f.bytes.size();
  const uint32_t want_magic = 0x0800u | static_cast<uint32_t>(ndims);
  if (size < 4)
    throw Error(
        fmt::format("{}: file ends inside the 4-byte IDX magic ({} bytes)", f.where(size), size),
        kRedownload);
  const uint32_t magic = be32(f.bytes.data());
  if (magic != want_magic)
    throw Error(
        fmt::format("{}: wrong magic 0x{:08x}, expected 0x{:08x} (IDX, unsigned bytes, "
                    "{} dims: {} file)",
                    f.where(0), magic, want_magic, ndims, ndims == 1 ? "a labels" : "an images"),
        "check that the images and labels files are not swapped; otherwise " +
            std::string(kRedownload));
  IdxHeader h;
  h.payload_offset = 4 + 4 * ndims;
  if (size < h.payload_offset)
    throw Error(fmt::format("{}: file ends inside the IDX header ({} of {} bytes)", f.where(size),
                            size, h.payload_offset),
                kRedownload);
  for (size_t d = 0; d < ndims; ++d) h.dims.push_back(be32(f.bytes.data() + 4 + 4 * d));
  if (h.dims[0] == 0)
    throw Error(fmt::format("{}: the header declares 0 samples", f.where(4)), kRedownload);
  for (size_t d = 1; d < ndims; ++d) {
    if (h.dims[d] != expect[d - 1])
      throw Error(fmt::format("{}: wrong dims: dimension {} is {}, expected {}", f.where(4 + 4 * d),
                              d, h.dims[d], expect[d - 1]),
                  fmt::format("this dataset's samples are {}x{}; the file belongs to another "
                              "IDX data set",
                              expect[0], expect[1]));
  }
  return h;
}

// The payload must be exactly N x prod(sample dims) bytes.
void check_payload(const FileBytes& f, const IdxHeader& h) {
  uint64_t per = 1;
  for (size_t d = 1; d < h.dims.size(); ++d) per *= static_cast<uint64_t>(h.dims[d]);
  const uint64_t end = h.payload_offset + static_cast<uint64_t>(h.dims[0]) * per;
  const uint64_t size = f.bytes.size();
  if (size < end)
    throw Error(fmt::format("{}: file is truncated: the header promises {} samples of {} bytes, "
                            "ending at byte {}",
                            f.where(size), h.dims[0], per, end),
                kRedownload);
  if (size > end)
    throw Error(fmt::format("{}: {} bytes of trailing garbage after the {} samples the header "
                            "declares",
                            f.where(end), size - end, h.dims[0]),
                kRedownload);
}

Tensor copy_payload(const FileBytes& f, const IdxHeader& h) {
  Tensor t = Tensor::empty(Shape(h.dims.begin(), h.dims.end()), DType::u8);
  if (t.nbytes() > 0) std::memcpy(t.raw(), f.bytes.data() + h.payload_offset, t.nbytes());
  return t;
}

void check_labels(const FileBytes& f, size_t offset, int64_t count, int stride, int classes) {
  for (int64_t i = 0; i < count; ++i) {
    const size_t at = offset + static_cast<size_t>(i) * stride;
    if (f.bytes[at] >= classes)
      throw Error(fmt::format("{}: label {} of sample {} is out of range: the dataset has {} "
                              "classes (0..{})",
                              f.where(at), f.bytes[at], i, classes, classes - 1),
                  kRedownload);
  }
}

}  // namespace

LabeledImages read_idx(const std::string& images_file, const std::string& labels_file, int classes,
                       int rows, int cols) {
  const FileBytes img = read_file_bytes(images_file, {});
  const IdxHeader ih = parse_header(img, {rows, cols});
  check_payload(img, ih);
  const FileBytes lab = read_file_bytes(labels_file, {});
  const IdxHeader lh = parse_header(lab, {});
  check_payload(lab, lh);
  if (ih.dims[0] != lh.dims[0])
    throw Error(fmt::format("{}: {} images, but {}: {} labels", img.where(4), ih.dims[0],
                            lab.where(4), lh.dims[0]),
                "the images and labels files must come from the same split (train or t10k)");
  check_labels(lab, lh.payload_offset, lh.dims[0], 1, classes);
  return {copy_payload(img, ih), copy_payload(lab, lh)};
}

}  // namespace dtrain
