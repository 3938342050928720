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
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
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

// A checkpoint read a piece at a time, so that resuming holds no copy of the model's
// state beside the live one (dtrain estimate's peak holds for a resumed run too). The
// constructor reads the prefix, the header and the end marker; with `verify`, it also
// streams the whole file once, checking every blob's checksum and the zero padding
// between blobs, holding one I/O buffer and no blob. Then `pieces` reads a blob
// `piece_elems` elements at a time into one tensor of that size, checking the blob's
// checksum again as it goes (a file changed since it was verified is an Error).
class CheckpointReader {
 public:
  struct Blob {
    std::string name;
    DType dtype = DType::f32;
    Shape shape;
    size_t offset = 0, bytes = 0;
    uint32_t crc = 0;
  };
  explicit CheckpointReader(const std::filesystem::path& file, bool verify = true);
  const std::filesystem::path& file() const { return file_; }
  const nlohmann::json& meta() const { return meta_; }
  const std::vector<Blob>& blobs() const { return blobs_; }
  bool has(std::string_view name) const;
  // The entry `name` (an Error naming the file and the blob when absent).
  const Blob& blob(std::string_view name) const;
  // The whole blob in a tensor of its shape, checked.
  Tensor read(std::string_view name) const;
  Tensor read_blob(const Blob& b) const;
  // `fn(lo, piece)` for each run of up to `piece_elems` elements of the blob, in order
  // (lo: the piece's first element; piece: flat, host, valid during the call only).
  void pieces(std::string_view name, int64_t piece_elems,
              const std::function<void(int64_t lo, const Tensor& piece)>& fn) const;
  // The meta and the file name without any tensor, for checks written on Checkpoint.
  Checkpoint header() const;
  // The header and, whole and checked, the blobs `want` names.
  Checkpoint read_wanted(const std::function<bool(const std::string&)>& want) const;
  // The padding between blobs is zeros and no two overlap (what `verify` checks besides
  // the blobs' checksums), reading the padding only.
  void check_padding() const;

 private:
  void read_at(size_t offset, size_t bytes, char* out) const;
  void scan(bool checksums) const;
  size_t data_start_ = 0;  // the first byte after the header
  std::filesystem::path file_;
  mutable std::ifstream in_;
  size_t size_ = 0;
  nlohmann::json meta_;
  std::vector<Blob> blobs_;
};

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
// <dir>/best.json names the checkpoint of a run's best evaluation (train.best): written
// by the trainer once that checkpoint is complete. The step it records, or none when
// there is no such file; an unreadable one is an Error naming it.
inline constexpr const char* kBestRecordName = "best.json";
std::optional<int64_t> best_record_step(const std::filesystem::path& dir);

// Deletes all but the newest `keep` checkpoints and those of the steps `also_keep`
// (the best evaluation's: train.best), and stale temporary files.
void prune_checkpoints(const std::filesystem::path& dir, int keep,
                       const std::vector<int64_t>& also_keep = {});

}  // namespace dtrain::runtime
