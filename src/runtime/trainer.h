// `dtrain train`: builds the model, data and optimizer a Job describes and runs
// the training loop on one process — steps or epochs, evaluation, metrics,
// checkpoints, exact resume and graceful stop on SIGINT / SIGTERM / SIGUSR1.
// Features the job file can name but this build cannot run yet (half
// precision, parallelism, ZeRO, compression, CUDA) are refused up front.
#pragma once

#include <optional>
#include <string>

#include "runtime/job.h"

namespace dtrain::runtime {

struct TrainRequest {
  Job job;
  std::string resolved_yaml;          // the job with every default, saved as <output_dir>/job.yaml
  std::optional<std::string> resume;  // "latest", a checkpoint file or a checkpoint directory
  int world_size = 1;                 // from the launcher's environment
};

// Returns the process exit code: 0 done, kExitInterrupted (signals.h) after a
// signal-triggered checkpoint. Throws Error for bad input (exit 2).
int train(const TrainRequest& request);

}  // namespace dtrain::runtime
