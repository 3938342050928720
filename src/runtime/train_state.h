// What a checkpoint holds and how it maps onto the live training state:
// parameters and buffers (flat, per dtype), optimizer buffers and step, the
// data position and the step counter (the RNG is counter-based, keyed by
// (seed, step), so seed and step are its whole state). Loading checks the
// model layout before anything is copied.
#pragma once

#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/sampler.h"
#include "dist/communicator.h"
#include "graph/executor.h"
#include "optim/optimizer.h"
#include "precision/loss_scaler.h"
#include "runtime/checkpoint.h"

namespace dtrain::runtime {

// The run's best evaluation so far (train.best), kept by every checkpoint so that a
// resumed run goes on comparing with it, and the patience count of early stopping.
struct BestEval {
  std::string metric;  // "loss" or "accuracy": what it was tracked by
  int64_t step = 0;    // the step of the best evaluation
  double loss = 0, accuracy = 0;
  double reference = 0;     // the value patience counts from (the last gain over min_delta)
  int64_t stale_evals = 0;  // evaluations since that gain
  bool stopped = false;     // the run ended early at this checkpoint (train.best.patience)
  // What the evaluations were of: "model" (the weights), or "ema" (optimizer.ema's
  // average); "model" in checkpoints written before it was kept.
  std::string weights = "model";
};

// The settings that differ between two resolved jobs (config::dump_job_yaml's text: two
// spaces per level, a block list kept whole under its key), as "key old -> new" joined by
// ", ", at most `shown` of them and a count of the rest; empty when none differ.
std::string changed_settings(const std::string& before, const std::string& after, size_t shown = 6);

struct TrainCounters {
  int64_t step = 0;       // optimizer steps done
  DataPosition position;  // where the training data continues
  uint64_t seed = 0;
  std::string arch;
  std::string config_hash;  // FNV-1a of the resolved job; a mismatch on resume is reported
  // The resolved job itself (config::dump_job_yaml), so a resume can name the settings
  // it changes (empty in checkpoints written before it was kept).
  std::string job_yaml;
  // A transformer's attention heads, the one shape key no tensor shows (0: not a
  // transformer, or a checkpoint written before it was kept). dtrain generate checks it.
  int64_t heads = 0;
  // The loss scaler's state (absent in checkpoints written before it existed).
  std::optional<precision::LossScalerState> scaler;
  // The part of the current logging window before this step: the finite losses' sum
  // (in step order) and their count, so that a run resumed mid-window logs the mean
  // the uninterrupted run logs (0 and 0 in checkpoints written before it was kept).
  double window_loss_sum = 0;
  int64_t window_losses = 0;
  // The last step's loss (NaN before the first step, and in checkpoints written before
  // it was kept): the summary's final_loss when a resume trains no step.
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  std::optional<BestEval> best;  // train.best.metric set and an evaluation done
  // An image folder's class names, by label (the training split's directories): what
  // dtrain predict names the classes by. Empty for other datasets.
  std::vector<std::string> classes;
  // optimizer.freeze: the optimizer steps each tensor was frozen for, by name (absent:
  // none), so that AdamW's bias correction of a tensor unfrozen later counts the steps it
  // was stepped (optim::Optimizer::set_frozen_steps).
  std::map<std::string, int64_t> frozen_steps;
  // The step's evaluation could not read its test data: the checkpoint was saved before
  // it, and a resume evaluates the step first (absent: false).
  bool eval_pending = false;
  // comm.allreduce auto: the algorithm chosen per bucket-size class (bytes, "native" /
  // "ring" / "hierarchical") on `world` data-parallel ranks of `backend` for these
  // gradient buckets (bytes each), which a resume with the same world, backend and
  // buckets keeps instead of timing again, so that it sums as the run did (three or more
  // addends are summed in another order by another algorithm). In a pipeline or tensor
  // grid (`grid`: its pipeline, data and tensor degrees) every data group takes the one
  // table its first group timed; `buckets` is empty, and `signature` hashes every rank's
  // buckets instead, which the resume's must equal.
  struct AutoAllreduce {
    int world = 0;
    std::string backend;
    std::vector<int64_t> buckets;
    std::vector<std::pair<int64_t, std::string>> classes;
    std::vector<int> grid;   // empty: plain data parallelism
    uint64_t signature = 0;  // with `grid`
  };
  std::optional<AutoAllreduce> allreduce_auto;
  // Loaded, not saved: whether the checkpoint holds optimizer.ema's average (its state
  // buffer "ema").
  bool ema = false;
};

// The class names a checkpoint's or export's metadata holds (`names`: a JSON list of
// strings, one per class); an Error naming `where` when it is anything else.
std::vector<std::string> class_names_in(const nlohmann::json& names, const std::string& where);
// How an image folder's classes now (`now`) differ from those a model was trained on
// (`then`): "the model was trained on 3 classes, data.path's training split has 3: class
// 0 is "blue" in the checkpoint, "aqua" in the folder"; empty when they are the same or
// either is unknown. A resume and predict --split test refuse the difference.
std::string class_mismatch(const std::vector<std::string>& then,
                           const std::vector<std::string>& now);

// `params`: the parameters the optimizer steps (the executor's for fp32, the fp32
// master weights of a half-precision job: same names and layout either way, so a
// checkpoint moves between precisions); `buffers`: the executor's.
// `extra`: more blobs (gradient compression's state: runtime/trainer.cpp), written as
// they are.
void save_train_state(const std::filesystem::path& file, const graph::FlatStore& params,
                      const graph::FlatStore& buffers, const optim::Optimizer& opt,
                      const TrainCounters& counters, const std::vector<NamedTensor>& extra = {});

// Sharded checkpoints (ZeRO, pipelines, tensor parallelism, gradient compression): a
// directory step-N/ with one shard file per rank of the save's group,
// rank-RRRRR-of-WWWWW.dtckpt, holding that rank's range of the fp32-layout parameters
// (the masters) and of every optimizer buffer (rank 0's also the buffers), each blob
// CRC-32C checked as in a single file; and manifest.dtckpt: the training metadata a
// single file carries, the layout, the world and ZeRO stage it was written with, and
// per shard its range, its byte count and the CRC-32C of its whole file, plus an id of
// this save that every shard repeats (shards of two saves do not mix). Written into
// step-N.partial/ (cleared first), every shard fsynced, then the manifest, then one
// rename to step-N/ after a barrier: a crash at any point leaves the previous
// checkpoint as it was, and the next save clears the partial directory.
struct ShardedSave {
  dist::Communicator* comm = nullptr;  // every rank that writes a shard (its group)
  int64_t begin = 0, end = 0;          // this rank's range of the fp32 layout
  Tensor params;                       // f32 [end - begin]: that range of the parameters
  const std::vector<graph::FlatEntry>* layout = nullptr;  // the fp32 layout
  int64_t total = 0;                                      // its elements, padding included
  const graph::FlatStore* buffers = nullptr;              // replicated; rank 0 writes them
  const optim::Optimizer* opt = nullptr;                  // this rank's shard of the state
  // Where opt's buffers start in the layout, when they hold more than [begin, end) (a
  // replica's whole state, of which this rank writes its part); unset: at begin.
  std::optional<int64_t> opt_base;
  int zero_stage = 0;
  std::string precision;
  // Called at each phase of the save ("shard", "written", "manifest", "renamed"): the
  // crash tests end a rank there (runtime/faults.h).
  std::function<void(std::string_view)> at_phase;
  std::vector<NamedTensor> extra;  // more blobs of this rank's own (compression's state)
};
void save_sharded_state(const std::filesystem::path& dir, const ShardedSave& save,
                        const TrainCounters& counters);

// Resume for a rank that steps the range [begin, end) of the fp32 layout (the whole
// layout without ZeRO), from a file or a sharded directory of any world size, stage
// or precision. Everything is checked first (the layouts, the optimizer, the manifest,
// every shard file's size and CRC-32C), then: `params` receives every piece of the
// fp32-layout parameters in increasing order (lo = its first element; f32, host),
// `opt` (made for [begin, end)) its range of every state buffer and the step, and
// `buffers` the buffers. A sharded checkpoint is streamed: one shard's parameters at
// a time, and of the optimizer state only the shards that overlap [begin, end).
struct RangeLoad {
  const std::vector<graph::FlatEntry>* layout = nullptr;  // the fp32 layout
  int64_t begin = 0, end = 0;
  std::function<void(int64_t lo, const Tensor& piece)> params;
  graph::FlatStore* buffers = nullptr;
  optim::Optimizer* opt = nullptr;
  // The extra blobs (save_train_state's `extra`, ShardedSave::extra): a single file's
  // all; of a sharded checkpoint written by `world` ranks, this rank's shard's and those
  // of rank 0's it lacks, none when written by another world size.
  int rank = 0, world = 1;
  std::function<void(const std::vector<const NamedTensor*>& extra)> extra;
  // Set: every piece of every optimizer state buffer goes here instead, in layout order
  // (`buffer` its name, lo its first element; f32, host), and `opt` (any range: its
  // options and buffer names are checked) receives the step only. Tensor parallelism
  // maps the one-rank model's pieces onto its parts this way, without holding it whole.
  std::function<void(const std::string& buffer, int64_t lo, const Tensor& piece)> state;
};
TrainCounters load_train_state_ranges(const std::filesystem::path& path, const RangeLoad& load);

// A checkpoint file, or a sharded directory assembled into the same form (whole
// tensors "params.f32", "buffers.<dtype>", "optim.<buffer>" and a single file's meta),
// after verifying the manifest and every shard; damage, a missing shard, or shards of
// two saves are an Error naming the file and what is wrong.
Checkpoint read_any_checkpoint(const std::filesystem::path& path);

// "latest" -> the newest checkpoint in `checkpoint_dir` (empty when there is none
// yet: a requeued job that never saved starts afresh); "best" -> the checkpoint that
// `checkpoint_dir`/best.json names (train.best; an error when none); a sharded checkpoint or a
// file -> itself; another directory -> its newest (an error when empty). `option` names
// the command-line option in errors.
std::filesystem::path resolve_resume(const std::string& resume,
                                     const std::filesystem::path& checkpoint_dir,
                                     std::string_view option = "--resume");

}  // namespace dtrain::runtime
