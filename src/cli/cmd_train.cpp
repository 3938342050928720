// `dtrain train JOB.yaml [--set key.path=value ...] [--resume latest|PATH]`:
// loads and validates the job exactly as `dtrain validate` does, then hands it
// to the runtime's trainer. Exit codes: README.md.
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "config/config.h"
#include "runtime/trainer.h"

namespace dtrain::cli {
namespace {

struct TrainArgs {
  std::string job;
  std::vector<std::string> overrides;
  std::string resume;
};

int run_train(const TrainArgs& args) {
  std::vector<std::string> warnings;
  config::ValidateContext ctx;
  ctx.world_size = world_from_env();
  ctx.warnings = &warnings;
  runtime::TrainRequest req;
  req.job = config::load_job_file(args.job, args.overrides, ctx);
  for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
  req.resolved_yaml = config::dump_job_yaml(req.job);
  req.world_size = ctx.world_size;
  if (!args.resume.empty()) {
    req.resume = args.resume;
  } else if (req.job.train.resume) {
    req.resume = *req.job.train.resume;
  }
  return runtime::train(req);
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
                  "a fresh start when there is none), a .dtckpt file, or a directory");
  cmd->callback([args, &action] { action = [args] { return run_train(*args); }; });
}

}  // namespace dtrain::cli
