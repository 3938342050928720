// `dtrain validate JOB.yaml [--set key.path=value ...] [--world N]`: loads and checks
// a job file exactly as `dtrain train` would and prints the resolved job as YAML.
// Allocates nothing and starts no communication; warnings go to stderr.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"

namespace dtrain::cli {
namespace {

struct ValidateArgs {
  std::string job;
  std::vector<std::string> overrides;
  int world = 0;  // 0: from the launcher's environment
};

// The rank count a launcher advertises (Open MPI, MPICH/PMI, SLURM), else 1.
int world_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (*end != '\0' || n < 1 || n > 1 << 24) {
      throw Error(fmt::format("{}={} is not a positive rank count", name, value),
                  "unset it, or pass --world N");
    }
    return static_cast<int>(n);
  }
  return 1;
}

int run_validate(const ValidateArgs& args) {
  std::vector<std::string> warnings;
  config::ValidateContext ctx;
  ctx.world_size = args.world > 0 ? args.world : world_from_env();
  ctx.warnings = &warnings;
  const Job job = config::load_job_file(args.job, args.overrides, ctx);
  for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
  std::fputs(config::dump_job_yaml(job).c_str(), stdout);
  return kExitOk;
}

}  // namespace

void add_validate(CLI::App& app, Action& action) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* cmd =
      app.add_subcommand("validate", "check a job file and print the resolved job as YAML");
  cmd->add_option("job", args->job, "job file (YAML)")->required();
  cmd->add_option("--set", args->overrides,
                  "override a key, e.g. --set optimizer.lr=0.01 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--world", args->world,
                  "world size to check the parallel layout against "
                  "(default: the launcher's, else 1)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->callback([args, &action] { action = [args] { return run_validate(*args); }; });
}

}  // namespace dtrain::cli
