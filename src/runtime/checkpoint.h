// Checkpoint files: named tensor blobs plus a JSON header (model, optimizer,
// RNG, data position, ...), each blob with a CRC-32C, written atomically
// (temporary file, fsync, rename, fsync of the directory). Reading verifies
// everything — magic, version, header checksum, sizes, every blob checksum —
// before returning, so a bad file is rejected before any training state is
// touched. Deliberately not a pickle-like format: nothing in a file runs code.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dtrain::runtime {

inline constexpr uint32_t kCheckpointVersion = 1;

struct NamedTensor {
  std::string name;
  Tensor tensor;  // host memory
};

struct Checkpoint {
  nlohmann::json meta;
  std::vector<NamedTensor> tensors;                // owned copies, verified
  const Tensor& get(std::string_view name) const;  // throws Error naming the file and tensor
  std::filesystem::path file;
};

void write_checkpoint(const std::filesystem::path& file, const nlohmann::json& meta,
                      const std::vector<NamedTensor>& tensors);
Checkpoint read_checkpoint(const std::filesystem::path& file);
// The header and only the blobs `want` names, each read on its own and checked against
// its CRC-32C (the rest of the file is not read: a caller that needs the whole file
// intact checks it otherwise, as a sharded checkpoint's manifest does).
Checkpoint read_checkpoint_blobs(const std::filesystem::path& file,
                                 const std::function<bool(const std::string&)>& want);

// <dir>/step-00000123.dtckpt
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, int64_t step);
// <dir>/step-00000123: a sharded checkpoint's directory (runtime/train_state.h).
std::filesystem::path sharded_checkpoint_path(const std::filesystem::path& dir, int64_t step);
// Whether `path` is a sharded checkpoint: a directory holding manifest.dtckpt.
bool is_sharded_checkpoint(const std::filesystem::path& path);
// The step a checkpoint's name carries: step-N.dtckpt, or step-N (a sharded checkpoint's
// directory); none for any other name.
std::optional<int64_t> step_of_name(const std::filesystem::path& path);
// The checkpoints in `dir`, oldest first (by step): step-N.dtckpt files and complete
// step-N directories (a step-N.partial directory, a save that did not finish, is not one).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints (and stale temporary files).
void prune_checkpoints(const std::filesystem::path& dir, int keep);

}  // namespace dtrain::runtime
