// Test helpers: a scratch directory that removes itself, and writers of IDX and
// CIFAR files (plain or gzip) with exactly the bytes a test asks for, so every
// reader error can be provoked. Not used by the library.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "core/error.h"

namespace dtrain::test {

using Bytes = std::vector<uint8_t>;

// The message of the dtrain::Error that f throws, or "<no error>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("dtrain-data-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// IDX images: magic 0x803, dims (n, rows, cols), pixel k of image i = (i * 7 + k) & 0xff.
inline Bytes idx_images(uint32_t n, uint32_t rows = 28, uint32_t cols = 28) {
  Bytes b;
  put_be32(b, 0x00000803);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t k = 0; k < rows * cols; ++k)
      b.push_back(static_cast<uint8_t>((i * 7 + k) & 0xff));
  return b;
}

// IDX labels: magic 0x801, label i = i % classes.
inline Bytes idx_labels(uint32_t n, uint32_t classes = 10) {
  Bytes b;
  put_be32(b, 0x00000801);
  put_be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i % classes));
  return b;
}

// CIFAR records: label bytes then 3072 pixels, pixel k of record i = (i + 3 * k) & 0xff.
inline Bytes cifar_records(uint32_t n, int label_bytes, uint32_t first = 0) {
  Bytes b;
  for (uint32_t i = first; i < first + n; ++i) {
    if (label_bytes == 2) b.push_back(static_cast<uint8_t>(i % 20));
    b.push_back(static_cast<uint8_t>(label_bytes == 2 ? i % 100 : i % 10));
    for (uint32_t k = 0; k < 3072; ++k) b.push_back(static_cast<uint8_t>((i + 3 * k) & 0xff));
  }
  return b;
}

inline void write_plain(const std::string& path, const Bytes& b) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) REQUIRE(std::fwrite(b.data(), 1, b.size(), f) == b.size());
  std::fclose(f);
}

inline void write_gzip(const std::string& path, const Bytes& b) {
  gzFile g = gzopen(path.c_str(), "wb");
  REQUIRE(g != nullptr);
  REQUIRE(gzwrite(g, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(g) == Z_OK);
}

inline Bytes read_all(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  Bytes b;
  for (int c; (c = std::fgetc(f)) != EOF;) b.push_back(static_cast<uint8_t>(c));
  std::fclose(f);
  return b;
}

// The four files of an MNIST-style directory, train n_train and test n_test samples.
inline void write_idx_set(const TempDir& dir, uint32_t n_train, uint32_t n_test, bool gz) {
  auto put = [&](const std::string& name, const Bytes& b) {
    gz ? write_gzip(dir.file(name + ".gz"), b) : write_plain(dir.file(name), b);
  };
  put("train-images-idx3-ubyte", idx_images(n_train));
  put("train-labels-idx1-ubyte", idx_labels(n_train));
  put("t10k-images-idx3-ubyte", idx_images(n_test));
  put("t10k-labels-idx1-ubyte", idx_labels(n_test));
}

}  // namespace dtrain::test
