// What a checkpoint holds and how it maps onto the live training state:
// parameters and buffers (flat, per dtype), optimizer buffers and step, the
// data position and the step counter (the RNG is counter-based, keyed by
// (seed, step), so seed and step are its whole state). Loading checks the
// model layout before anything is copied.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "data/sampler.h"
#include "graph/executor.h"
#include "optim/optimizer.h"
#include "precision/loss_scaler.h"

namespace dtrain::runtime {

struct TrainCounters {
  int64_t step = 0;       // optimizer steps done
  DataPosition position;  // where the training data continues
  uint64_t seed = 0;
  std::string arch;
  std::string config_hash;  // FNV-1a of the resolved job; a mismatch on resume is reported
  // The loss scaler's state (absent in checkpoints written before it existed).
  std::optional<precision::LossScalerState> scaler;
};

// `params`: the parameters the optimizer steps (the executor's for fp32, the fp32
// master weights of a half-precision job: same names and layout either way, so a
// checkpoint moves between precisions); `buffers`: the executor's.
void save_train_state(const std::filesystem::path& file, const graph::FlatStore& params,
                      const graph::FlatStore& buffers, const optim::Optimizer& opt,
                      const TrainCounters& counters);

// Verifies the file and that it matches this model and optimizer, then copies
// everything in. Throws Error (naming the file and the mismatch) before touching
// any state when it does not fit.
TrainCounters load_train_state(const std::filesystem::path& file, graph::FlatStore& params,
                               graph::FlatStore& buffers, optim::Optimizer& opt);

// "latest" -> the newest checkpoint in `checkpoint_dir` (empty when there is none
// yet: a requeued job that never saved starts afresh); a directory -> its newest
// (an error when empty); a file -> itself.
std::filesystem::path resolve_resume(const std::string& resume,
                                     const std::filesystem::path& checkpoint_dir);

}  // namespace dtrain::runtime
