// Every way a dataset file can be wrong ends in a dtrain::Error that names the file,
// the byte offset and what to do — never a crash. Each case writes its own bad file.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "core/error.h"
#include "data/dataset.h"
#include "data/file_bytes.h"
#include "data_files.h"

using namespace dtrain;
using namespace dtrain::test;

namespace {

// Reads an IDX pair where the images or labels file holds `bad`.
std::string idx_error(const Bytes& images, const Bytes& labels, bool gz = false) {
  TempDir dir("bad-idx");
  const std::string ip = dir.file("images"), lp = dir.file("labels");
  gz ? write_gzip(ip, images) : write_plain(ip, images);
  write_plain(lp, labels);
  return error_of([&] { read_idx(ip, lp, 10); });
}

std::string cifar_error(const Bytes& records, CifarVariant v) {
  TempDir dir("bad-cifar");
  write_plain(dir.file("batch.bin"), records);
  return error_of([&] { read_cifar({dir.file("batch.bin")}, v); });
}

}  // namespace

TEST_CASE("IDX: wrong magic names the file, byte 0, and the swap it suggests") {
  const std::string e = idx_error(idx_labels(4), idx_labels(4));
  CHECK(has(e, "images: byte 0: wrong magic 0x00000801, expected 0x00000803"));
  CHECK(has(e, "hint: check that the images and labels files are not swapped"));
  Bytes b = idx_images(4);
  b[2] = 0x0d;  // a float IDX file
  CHECK(has(idx_error(b, idx_labels(4)), "wrong magic 0x00000d03"));
  CHECK(
      has(idx_error(idx_images(4), idx_images(4)), "(IDX, unsigned bytes, 1 dims: a labels file)"));
}

TEST_CASE("IDX: a header that declares no samples names the file") {
  CHECK(has(idx_error(idx_images(0), idx_labels(0)),
            "images: byte 4: the header declares 0 samples"));
}

TEST_CASE("IDX: wrong dims") {
  const std::string e = idx_error(idx_images(4, 27, 28), idx_labels(4));
  CHECK(has(e, "images: byte 8: wrong dims: dimension 1 is 27, expected 28"));
  CHECK(has(idx_error(idx_images(4, 28, 32), idx_labels(4)), "byte 12: wrong dims"));
}

TEST_CASE("IDX: truncated header") {
  CHECK(has(idx_error(Bytes{0, 0}, idx_labels(4)), "images: byte 2: file ends inside the 4-byte"));
  Bytes b = idx_images(4);
  b.resize(10);
  CHECK(has(idx_error(b, idx_labels(4)),
            "images: byte 10: file ends inside the IDX header (10 of 16"));
  CHECK(has(idx_error(Bytes{}, idx_labels(4)), "images: byte 0: file ends inside"));
}

TEST_CASE("IDX: truncated payload, plain and inside gzip") {
  Bytes b = idx_images(4);
  b.resize(b.size() - 5);
  const std::string e = idx_error(b, idx_labels(4));
  CHECK(has(e,
            "images: byte 3147: file is truncated: the header promises 4 samples of 784 bytes, "
            "ending at byte 3152"));
  CHECK(has(e, "hint: "));
  const std::string gz = idx_error(b, idx_labels(4), true);
  CHECK(has(gz, "byte 3147 (of the decompressed data): file is truncated"));
  Bytes l = idx_labels(4);
  l.pop_back();
  CHECK(has(idx_error(idx_images(4), l), "labels: byte 11: file is truncated"));
}

TEST_CASE("IDX: trailing garbage") {
  Bytes b = idx_images(3);
  b.insert(b.end(), {1, 2, 3});
  CHECK(has(idx_error(b, idx_labels(3)),
            "images: byte 2368: 3 bytes of trailing garbage after the 3 samples"));
}

TEST_CASE("IDX: image and label counts differ") {
  const std::string e = idx_error(idx_images(10), idx_labels(9));
  CHECK(has(e, "images: byte 4: 10 images, but "));
  CHECK(has(e, "labels: byte 4: 9 labels"));
}

TEST_CASE("IDX: a label out of range names its byte") {
  Bytes l = idx_labels(6);
  l[8 + 3] = 10;
  CHECK(has(idx_error(idx_images(6), l),
            "labels: byte 11: label 10 of sample 3 is out of range: the dataset has 10 classes"));
}

TEST_CASE("a corrupt or truncated gzip stream is an error, not garbage data") {
  TempDir dir("bad-gz");
  write_gzip(dir.file("x.gz"), idx_images(200));
  Bytes z = read_all(dir.file("x.gz"));
  Bytes flipped = z;
  for (size_t i = 20; i < 60 && i < flipped.size(); ++i) flipped[i] ^= 0x5a;
  write_plain(dir.file("flipped.gz"), flipped);
  const std::string e = error_of([&] { read_file_bytes(dir.file("flipped.gz"), {}); });
  CHECK(has(e, "flipped.gz: corrupt gzip stream near compressed byte"));
  CHECK(has(e, "hint: the download is damaged"));
  z.resize(z.size() / 2);
  write_plain(dir.file("half.gz"), z);
  CHECK(has(error_of([&] { read_file_bytes(dir.file("half.gz"), {}); }),
            "half.gz: corrupt gzip stream"));
}

TEST_CASE("missing files say which package or download provides them") {
  TempDir dir("missing");
  DataOptions o;
  o.dataset = DatasetName::fashion_mnist;
  o.path = dir.str();
  std::string e = error_of([&] { open_dataset(o, Split::train); });
  CHECK(has(e, "neither train-images-idx3-ubyte nor train-images-idx3-ubyte.gz exists"));
  CHECK(has(e, "hint: apt-get install dataset-fashion-mnist"));
  o.path = dir.file("nowhere");
  e = error_of([&] { open_dataset(o, Split::test); });
  CHECK(has(e, "nowhere: dataset directory not found (looking for t10k-images-idx3-ubyte)"));
  o.dataset = DatasetName::cifar10;
  CHECK(has(error_of([&] { open_dataset(o, Split::train); }), "cifar-10-binary.tar.gz"));
  CHECK(has(error_of([&] { read_file_bytes(dir.file("gone"), "install it"); }),
            "gone: file not found\n  hint: install it"));
  CHECK(has(error_of([&] { read_file_bytes(dir.str(), {}); }), "is a directory"));
  o.dataset = DatasetName::mnist;
  o.path.reset();
  CHECK(has(error_of([&] { open_dataset(o, Split::train); }), "dataset mnist needs data.path"));
}

TEST_CASE("CIFAR: partial record, labels out of range, empty file") {
  Bytes r = cifar_records(3, 1);
  r.resize(r.size() - 100);
  CHECK(has(cifar_error(r, CifarVariant::cifar10),
            "batch.bin: byte 6146: file ends inside record 2 (2973 of its 3073 bytes present)"));
  r = cifar_records(3, 1);
  r[3073] = 10;
  CHECK(has(cifar_error(r, CifarVariant::cifar10),
            "batch.bin: byte 3073: class label 10 of record 1 is out of range (0..9)"));
  r = cifar_records(3, 2);
  r[2 * 3074 + 1] = 100;
  CHECK(has(cifar_error(r, CifarVariant::cifar100), "byte 6149: fine label 100 of record 2"));
  r = cifar_records(3, 2);
  r[3074] = 20;
  CHECK(has(cifar_error(r, CifarVariant::cifar100), "byte 3074: coarse label 20 of record 1"));
  CHECK(has(cifar_error(Bytes{}, CifarVariant::cifar10), "batch.bin: file is empty"));
  // A CIFAR-100 file read as CIFAR-10 is caught by its record size (3074 vs 3073).
  CHECK(has(cifar_error(cifar_records(5, 2), CifarVariant::cifar10), "file ends inside record"));
}
