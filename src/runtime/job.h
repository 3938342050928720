// The whole job: every module's typed options in one aggregate, plus the run,
// train, memory and logging options that the runtime itself consumes. Plain data
// with defaults; src/config is the only place that turns YAML into a Job.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "compress/options.h"
#include "core/device.h"
#include "core/enum_names.h"
#include "data/options.h"
#include "dist/options.h"
#include "models/options.h"
#include "optim/options.h"
#include "precision/options.h"

namespace dtrain {

struct RunOptions {
  std::string name = "dtrain";
  std::string output_dir = "runs";
  int64_t seed = 0;
};

struct CheckpointOptions {
  std::optional<int64_t> every;  // unset: only at the end and on SIGTERM / SIGUSR1
  int keep = 3;                  // newest checkpoints kept on disk
  std::string dir;               // when the job leaves it out: <output_dir>/checkpoints
};

// The evaluation that train.best compares: the test loss (lower is better) or the
// accuracy (higher; a language model's token accuracy).
enum class BestMetric : uint8_t { none, loss, accuracy };
inline constexpr std::pair<BestMetric, std::string_view> kBestMetricNames[] = {
    {BestMetric::none, "none"}, {BestMetric::loss, "loss"}, {BestMetric::accuracy, "accuracy"}};
inline std::string_view to_string(BestMetric v) { return enum_name(kBestMetricNames, v); }
inline bool from_string(std::string_view text, BestMetric& out) {
  return enum_parse(kBestMetricNames, text, out);
}
inline const auto& enum_names(BestMetric) { return kBestMetricNames; }

// The run's best evaluation (every train.eval_every steps and at the end): its
// checkpoint kept beside the newest train.checkpoint.keep and named by
// <checkpoint dir>/best.json (`--checkpoint best`), and the run ended early once
// `patience` evaluations in a row have not improved by more than min_delta on the value
// of the last evaluation that did (Keras' EarlyStopping rule).
struct BestOptions {
  BestMetric metric = BestMetric::none;
  bool keep_checkpoint = true;
  int64_t patience = 0;  // 0: never end early
  double min_delta = 0;
};

// Exactly one of steps and epochs is set (an epoch is one pass over the dataset).
struct TrainOptions {
  std::optional<int64_t> steps;
  std::optional<int64_t> epochs;
  std::optional<int64_t> eval_every;  // unset: no evaluation
  int64_t log_every = 10;
  CheckpointOptions checkpoint;
  BestOptions best;
  std::optional<std::string> resume;  // checkpoint file or directory to resume from
};

enum class ActivationCheckpointing : uint8_t { none, block, every_k, sqrt };
inline constexpr std::pair<ActivationCheckpointing, std::string_view>
    kActivationCheckpointingNames[] = {{ActivationCheckpointing::none, "none"},
                                       {ActivationCheckpointing::block, "block"},
                                       {ActivationCheckpointing::every_k, "every_k"},
                                       {ActivationCheckpointing::sqrt, "sqrt"}};
inline std::string_view to_string(ActivationCheckpointing v) {
  return enum_name(kActivationCheckpointingNames, v);
}
inline bool from_string(std::string_view text, ActivationCheckpointing& out) {
  return enum_parse(kActivationCheckpointingNames, text, out);
}
inline const auto& enum_names(ActivationCheckpointing) { return kActivationCheckpointingNames; }

struct OffloadOptions {
  bool optimizer = false;  // optimizer state lives in host memory
  bool params = false;     // fp32 parameters live in host memory (needs ZeRO-3)
};

struct MemoryOptions {
  ActivationCheckpointing checkpointing = ActivationCheckpointing::none;
  int every_k = 2;  // used by every_k: one checkpointed segment per k blocks
  OffloadOptions offload;
  bool pool = true;  // caching allocator with size classes for non-arena allocations
};

// Where the logs go; how often is train.log_every.
struct ProfileOptions {
  int64_t start = 0;  // first profiled step
  int64_t steps = 0;  // 0: no profile
};

// Text from a GPT-2 as it trains: every `every` steps, `count` samples of up to `tokens`
// new tokens after <|endoftext|> and the prompt, drawn as `dtrain generate` draws them
// (runtime/generate.h), through the training graph itself in evaluation mode.
struct SampleOptions {
  int64_t every = 0;                  // 0: none
  std::optional<std::string> prompt;  // after <|endoftext|>; unset: nothing more
  int64_t tokens = 32;
  int64_t count = 1;  // at most data.micro_batch (the rows of one forward)
  double temperature = 0.8;
  int64_t top_k = 0;  // 0: every token
};

struct LoggingOptions {
  bool console = true;       // progress line on stderr
  bool jsonl = true;         // <output_dir>/metrics.jsonl, one JSON line per log step
  bool tensorboard = false;  // <output_dir>/tb event files
  ProfileOptions profile;    // Chrome trace of steps [start, start + steps)
  SampleOptions samples;     // <output_dir>/samples.jsonl and the console
};

struct Job {
  RunOptions run;
  ModelOptions model;
  DataOptions data;
  OptimizerOptions optimizer;
  TrainOptions train;
  PrecisionOptions precision;
  ParallelOptions parallel;
  CommOptions comm;
  CompressOptions compress;
  MemoryOptions memory;
  Device device = Device::cpu();
  LoggingOptions logging;
};

}  // namespace dtrain
