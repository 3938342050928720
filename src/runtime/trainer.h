// `dtrain train`: builds the model, data and optimizer a Job describes and runs
// the training loop on one process or as one rank of a data-parallel world —
// steps or epochs, evaluation, metrics, checkpoints, exact resume and graceful
// stop on SIGINT / SIGTERM / SIGUSR1 (agreed across ranks). Combinations the job
// file can name but this build cannot run yet (for instance a pipeline on CUDA) are
// refused up front, by key. The session itself is runtime/train_session.h.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dist/communicator.h"
#include "runtime/job.h"
#include "runtime/signals.h"

namespace dtrain::dist {
class Watchdog;
}

namespace dtrain::runtime {

struct TrainRequest {
  Job job;
  std::string resolved_yaml;          // the job with every default, saved as <output_dir>/job.yaml
  std::optional<std::string> resume;  // "latest", a checkpoint file or a checkpoint directory
  int world_size = 1;                 // the world communicator's size
  // Set by `train --nproc`'s launcher (DTRAIN_LAUNCHER_STOP_FILE, in a directory of its
  // own): once every rank agreed to stop, rank 0 writes "stopping" there (the launcher
  // stops resending the stop), and after the checkpoint the command writes "stopped"
  // (cli/cmd_train.cpp); a stopped rank then exits 0 where it would exit
  // kExitInterrupted, and the launcher, reading "stopped", exits kExitInterrupted itself:
  // mpirun sees a clean end and prints no failure banner.
  std::string stop_file;
};

class TrainSession;
struct TrainSessionDeleter {
  void operator()(TrainSession* s) const;
};
using TrainSessionPtr = std::unique_ptr<TrainSession, TrainSessionDeleter>;

// Builds the model, data, optimizer and gradient sync and resumes (no collective
// communication: safe inside runtime::agree_on_startup). Throws Error for bad input.
TrainSessionPtr prepare_training(const TrainRequest& request, dist::Communicator& world);
// Trains. Returns the process exit code: 0 done, kExitInterrupted (signals.h) after a
// signal-triggered checkpoint (a signal on any rank stops every rank at the same step).
// Communicators the run creates (NCCL for a GPU job) are added to `watchdog` when given.
int run_training(TrainSession& session, const StopSignals& signals, dist::Watchdog* watchdog);

// Both on one process (world of one).
int train(const TrainRequest& request);

// What the job file can switch on that `dtrain train` cannot honour yet (a layout's
// combinations: tensor or pipeline parallelism on CUDA, ZeRO-2/3 in a pipeline, half
// weights without masters under ZeRO or in a pipeline), as the Error train stops with;
// `dtrain validate` asks the same.
void require_trainable(const Job& job);
// model.init_from on a fresh run: refused with tensor parallelism (train.cpp's
// init_from; validate asks where the run would not resume).
void require_init_from_supported(const Job& job);
// logging.samples: the tokenizer read and the prompt checked against the context, as
// the trainer starts them (trainer_samples.cpp).
void check_samples_prompt(const Job& job);

}  // namespace dtrain::runtime
