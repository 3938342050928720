// `dtrain train JOB.yaml [--set key.path=value ...] [--resume latest|best|PATH] [--nproc N]`:
// loads and validates the job exactly as `dtrain validate` does, then hands it
// to the runtime's trainer. Under a launcher (mpirun, srun) every rank runs this;
// the ranks agree that each of them could start before training begins. --nproc N
// starts N local ranks through mpirun itself. Exit codes: README.md.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "config/config.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "dist/communicator.h"
#include "dist/launcher.h"
#include "dist/watchdog.h"
#include "kernels/device_info.h"
#include "runtime/signals.h"
#include "runtime/startup.h"
#include "runtime/trainer.h"

namespace dtrain::cli {
namespace {

struct TrainArgs {
  std::string job;
  std::vector<std::string> overrides;
  std::string resume;
  int nproc = 0;
};

// mpirun -np N ... <this binary> train JOB [--set ...] [--resume ...] (local_mpirun), run
// as a child whose exit status is ours (run_ranks: a stop signal reaches the ranks).
int run_local_ranks(const TrainArgs& args) {
  RanksOptions o;
  o.stop_file = private_stop_file();
  std::vector<std::string> argv = local_mpirun(args.nproc, "train");
  if (!o.stop_file.empty())
    argv.insert(argv.end(), {"-x", "DTRAIN_LAUNCHER_STOP_FILE=" + o.stop_file});
  argv.insert(argv.end(), {self_executable(), "train", args.job});
  for (const std::string& o : args.overrides) argv.insert(argv.end(), {"--set", o});
  if (!args.resume.empty()) argv.insert(argv.end(), {"--resume", args.resume});
  return run_ranks(argv, o);
}

// Under srun or mpirun without OMP_NUM_THREADS, every rank would start an OpenMP pool
// as wide as the machine (dist::threads_per_rank); --nproc sets the variable itself.
void size_rank_threads() {
  const std::optional<dist::RankThreads> t = dist::threads_per_rank(dist::usable_cpus());
  if (!t) return;
  set_num_threads(t->threads);
  if (dist::launcher_rank() == 0) {
    std::fprintf(stderr,
                 "dtrain: note: OMP_NUM_THREADS is not set: each of the %d ranks on this "
                 "machine runs %d OpenMP thread(s) (%s)\n",
                 dist::launcher_local_size().value_or(1), t->threads, t->source);
  }
}

int run_train(const TrainArgs& args) {
  if (args.nproc > 0) return run_local_ranks(args);
  // Installed before MPI starts and the job loads, so a stop then (a Ctrl-C passed on by
  // --nproc as SIGUSR1, a scancel) is a graceful stop too, never the default action.
  runtime::StopSignals signals;
  size_rank_threads();
  const std::unique_ptr<dist::Communicator> world = dist::make_world_communicator();
  // After MPI's own handlers: a crash names the rank before they run.
  runtime::report_fatal_signals(world->size() > 1 ? fmt::format("dtrain[rank {}]", world->rank())
                                                  : std::string("dtrain"));
  runtime::TrainRequest req;
  runtime::TrainSessionPtr session;
  config::SourceMap where;  // a refusal naming a key the job wrote says where it was written
  runtime::agree_on_startup(*world, [&] {
    std::vector<std::string> warnings;
    config::ValidateContext ctx;
    ctx.world_size = world->size();
    ctx.warnings = &warnings;
    req.job = config::load_job_file(args.job, args.overrides, ctx, &where);
    host_allocator().set_caching(req.job.memory.pool);  // before the first tensor
    if (world->rank() == 0) {
      for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
    }
    req.resolved_yaml = config::dump_job_yaml(req.job);
    // Several ranks on a machine with several GPUs: one GPU each, by local rank, unless
    // the job names another than cuda:0 (SLURM's --gpus-per-task leaves one visible).
    if (world->size() > 1 && req.job.device.is_cuda() && req.job.device.index == 0) {
      const auto gpus = static_cast<int>(kernels::query_cuda().devices.size());
      if (gpus > 1) req.job.device.index = dist::launcher_local_rank().value_or(0) % gpus;
    }
    req.world_size = ctx.world_size;
    if (const char* f = std::getenv("DTRAIN_LAUNCHER_STOP_FILE"); f != nullptr && *f != '\0')
      req.stop_file = f;
    if (!args.resume.empty()) {
      req.resume = args.resume;
    } else if (req.job.train.resume) {
      req.resume = *req.job.train.resume;
    }
    world->set_ranks_per_node(req.job.comm.ranks_per_node);
    config::located_errors(where, [&] { session = runtime::prepare_training(req, *world); });
  });
  // From here on every collective is watched: a dead or hung peer ends this rank too.
  std::optional<dist::Watchdog> watchdog;
  // Heartbeats go beside the rank logs, so a timeout can name the rank that is missing.
  if (world->size() > 1) {
    watchdog.emplace(*world, req.job.comm.timeout_s, dist::Watchdog::OnTimeout{},
                     std::filesystem::path(req.job.run.output_dir) / "logs");
  }
  const int rc = runtime::run_training(*session, signals, watchdog ? &*watchdog : nullptr);
  // Under --nproc's launcher a stop is said through req.stop_file (runtime/trainer.h): rank
  // 0 writes "stopped" after the checkpoint, or exits 4 itself where it cannot.
  if (rc != runtime::kExitInterrupted || req.stop_file.empty()) return rc;
  if (world->rank() != 0) return 0;
  std::ofstream out(req.stop_file, std::ios::trunc);
  out << "stopped\n";
  out.close();
  return out ? 0 : rc;
}

}  // namespace

void add_train(CLI::App& app, Action& action) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "train the model a job file describes");
  cmd->add_option("job", args->job, "job file (YAML)")->required();
  cmd->add_option("--set", args->overrides,
                  "override a key, e.g. --set optimizer.lr=0.01 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--resume", args->resume,
                  "continue from a checkpoint: latest (the newest in train.checkpoint.dir, or "
                  "a fresh start when there is none), best (the one train.best kept), a "
                  ".dtckpt file, or a directory");
  cmd->add_option("--nproc", args->nproc,
                  "run N data-parallel ranks on this machine (starts them with mpirun)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->callback([args, &action] { action = [args] { return run_train(*args); }; });
}

}  // namespace dtrain::cli
