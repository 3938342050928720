// Typed options of the data module: which dataset, where, and the batch geometry.
// Plain data with defaults; src/config fills and checks them (including the
// batch divisibility rules). No file access here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace dtrain {

enum class DatasetName : uint8_t { synthetic, fashion_mnist, mnist, cifar10, cifar100, tokens };
inline constexpr std::pair<DatasetName, std::string_view> kDatasetNames[] = {
    {DatasetName::synthetic, "synthetic"}, {DatasetName::fashion_mnist, "fashion-mnist"},
    {DatasetName::mnist, "mnist"},         {DatasetName::cifar10, "cifar10"},
    {DatasetName::cifar100, "cifar100"},   {DatasetName::tokens, "tokens"}};
inline std::string_view to_string(DatasetName v) {
  for (const auto& [e, s] : kDatasetNames)
    if (e == v) return s;
  return "?";
}
inline bool from_string(std::string_view text, DatasetName& out) {
  for (const auto& [e, s] : kDatasetNames)
    if (s == text) {
      out = e;
      return true;
    }
  return false;
}
inline const auto& enum_names(DatasetName) { return kDatasetNames; }

// Shape of the samples a real dataset yields; image datasets only.
struct DatasetShape {
  int image_size = 0;
  int channels = 0;
  int classes = 0;
};
inline std::optional<DatasetShape> dataset_shape(DatasetName d) {
  switch (d) {
    case DatasetName::fashion_mnist:
    case DatasetName::mnist:
      return DatasetShape{28, 1, 10};
    case DatasetName::cifar10:
      return DatasetShape{32, 3, 10};
    case DatasetName::cifar100:
      return DatasetShape{32, 3, 100};
    default:
      return std::nullopt;
  }
}

// global_batch = micro_batch x data-parallel ranks x accumulation micro-steps.
struct DataOptions {
  DatasetName dataset = DatasetName::synthetic;
  std::optional<std::string> path;  // required for every dataset but synthetic
  int64_t global_batch = 32;
  int64_t micro_batch = 32;  // per rank; when absent from the job: global_batch / data ranks
  int workers = 2;
  bool shuffle = true;
  bool drop_last = true;
};

}  // namespace dtrain
