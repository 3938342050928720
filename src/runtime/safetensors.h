// The safetensors format (Hugging Face): u64 little-endian header length N, N bytes
// of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}} padded with spaces, then the tensors' bytes back
// to back (offsets from the end of the header). Used to export a checkpoint's weights
// under PyTorch names (runtime/export_names.h) and to start a job from such weights
// (model.init_from). Reading checks every offset and size before returning; nothing
// in a file is executed.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "graph/params.h"
#include "runtime/checkpoint.h"

namespace dtrain::runtime {

struct SafetensorsFile {
  std::filesystem::path file;
  std::vector<NamedTensor> tensors;  // in the order of their data; host memory
  std::map<std::string, std::string> metadata;
  const Tensor* find(std::string_view name) const;  // nullptr when absent
};

// One tensor's place in a safetensors file: its bytes [begin, end) after the header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};
// A safetensors file opened to read one tensor at a time (model.init_from: a model's
// weights without the whole file in memory). Opening reads and checks the header as
// read_safetensors does (an Error naming the file); read(i) reads entry i's bytes into
// host memory (an Error when the file has changed or shrunk since).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& file);
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  Tensor read(size_t i);

 private:
  std::filesystem::path file_;
  std::ifstream in_;
  uint64_t data_at_ = 0;  // the header's end: where entry offsets count from
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Every tensor of `file` (F32, F16, BF16, F64, I64, I32, U8: other dtypes, a short or
// damaged file, overlapping or uncovered data are an Error naming the file and tensor).
SafetensorsFile read_safetensors(const std::filesystem::path& file);
// Written to a temporary file beside `file`, fsynced, renamed over it.
void write_safetensors(const std::filesystem::path& file, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// A checkpoint's (read_any_checkpoint's) parameters and buffers in f32, one tensor per
// layout entry (its own shape), params first: widened from half when the run kept
// half weights without masters.
std::vector<NamedTensor> checkpoint_model_tensors(const Checkpoint& ck);

// Which of a checkpoint's weights the model tensors above are: "model" (the weights the
// optimizer stepped), "ema" (optimizer.ema's average, the state buffer "ema") or "auto"
// (the average when the checkpoint holds one). Selecting the average puts it in the
// place of the weights; asking for it of a checkpoint without one, or another choice,
// is an Error. Returns what was selected ("model" or "ema").
std::string select_weights(Checkpoint& ck, std::string_view choice);
// Whether the checkpoint holds optimizer.ema's average (its blob "optim.ema").
bool holds_average(const Checkpoint& ck);

struct ExportSummary {
  std::string arch;
  int64_t tensors = 0, elements = 0, bytes = 0;  // bytes: the whole file
};
// The checkpoint's model (parameters, and batch-norm running statistics) under the
// reference implementation's names, in `dtype` (f32, bf16 or f16).
// `ema`: the checkpoint's weights are optimizer.ema's average (select_weights), which the
// file's metadata records ("weights": "ema", else "model").
ExportSummary export_safetensors(const Checkpoint& ck, const std::filesystem::path& out,
                                 DType dtype, bool ema = false);

// model.init_from: a safetensors file with the reference names of `arch`'s family
// (F32, BF16 or F16, widened to f32) -> whole f32 buffers in our flat layouts (offsets
// as graph::FlatStore assigns them to these entries, whatever their dtype; padding 0).
// A name the model lacks, a name of the model the file lacks, or another shape is an
// Error naming the file and the tensor; tensors of the reference that dtrain does not
// train (num_batches_tracked, tied copies: export_names.h) are skipped. Task heads
// (is_head_tensor) are the exception that fine-tuning needs: a head tensor of the file
// that the model lacks or holds in another shape (10 classes instead of 1000) is not
// used, and a head tensor of the model that the file lacks keeps its seeded value.
struct InitWeights {
  Tensor params;        // f32 [FlatStore(params).buffer_elems(f32)] with every entry made f32
  Tensor buffers;       // the same for the buffers (undefined when there are none)
  int64_t tensors = 0;  // read from the file
  // The runs [lo, lo + n) of `params` that came from the file, in order: one run over
  // the whole buffer unless a head is fresh.
  std::vector<std::pair<int64_t, int64_t>> pieces;
  std::vector<std::string> fresh;   // the model's head tensors left at their seeded values
  std::vector<std::string> unused;  // the file's head tensors not used (absent or reshaped)
  std::map<std::string, std::string> metadata;  // the file's __metadata__
};
// `take` set: streamed instead. Each file tensor's rows of its parameter go to
// take(lo, values) as they are read (values: f32, the layout's elements [lo, lo +
// numel), valid during the call), and InitWeights::params stays undefined (nor are
// `pieces` filled): no f32 copy of the whole model is held, only the tensor read, its
// widening and its rows in layout order (the buffers, small, still come back whole). A
// tensor the checks refuse after others were taken leaves those taken: the caller stops.
using InitTake = std::function<void(int64_t lo, const Tensor& values)>;
InitWeights load_init_weights(const std::filesystem::path& file, std::string_view arch,
                              const std::vector<graph::FlatEntry>& params,
                              const std::vector<graph::FlatEntry>& buffers,
                              const InitTake& take = {});

}  // namespace dtrain::runtime
