// The subcommand table: each subcommand lives in its own cmd_<name>.cpp and
// registers itself on the CLI11 app through one add_<name>() function listed in main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "runtime/job.h"

namespace dtrain::cli {

// Exit codes (documented in README.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,     // a dtrain bug (an internal check failed)
  kExitBadInput = 2,     // bad config, bad command line, bad input file
  kExitRuntime = 3,      // the job could not run (no CUDA device, the loss diverged, ...)
  kExitInterrupted = 4,  // stopped by SIGINT / SIGTERM / SIGUSR1 after saving a checkpoint
};

// A subcommand stores its action here; main() runs the one that was selected.
using Action = std::function<int()>;

int run_version();  // prints `dtrain <version>` (also for `dtrain --version`)
void add_version(CLI::App& app, Action& action);
void add_info(CLI::App& app, Action& action);
void add_validate(CLI::App& app, Action& action);
void add_estimate(CLI::App& app, Action& action);
void add_plan(CLI::App& app, Action& action);  // the layout planner
void add_train(CLI::App& app, Action& action);
void add_data(CLI::App& app, Action& action);  // data tokenize
void add_ckpt(CLI::App& app, Action& action);  // ckpt inspect | verify | export
void add_bench(CLI::App& app, Action& action);
void add_report(CLI::App& app, Action& action);
void add_generate(CLI::App& app, Action& action);
void add_predict(CLI::App& app, Action& action);  // a BERT's classes or fill-mask

// What predict and generate say after the weights' path: " (step N)", " (step N, EMA
// weights)", " (EMA weights)" (an export of the average) or nothing.
inline std::string weights_label(int64_t step, bool ema) {
  std::string parts = step >= 0 ? "step " + std::to_string(step) : "";
  if (ema) parts += parts.empty() ? "EMA weights" : ", EMA weights";
  return parts.empty() ? "" : " (" + parts + ")";
}

// --weights auto|ema|model of predict, generate and ckpt export: which weights of a
// checkpoint (optimizer.ema's average or the weights the optimizer stepped).
void add_weights_option(CLI::App* cmd, std::string& which);

// --device D of estimate and generate: checked as typed, then appended to `overrides`
// as device=D (nothing when D is empty).
void add_device_override(const std::string& device, std::vector<std::string>& overrides);

// The job file of generate and predict: the model's job, checked for what inference reads
// (its precision, model and data keys, in its own world), with --set and --device
// applied; its warnings printed.
Job load_model_job(const std::string& file, std::vector<std::string> overrides,
                   const std::string& device, config::SourceMap* where = nullptr);
// run(load_model_job's job), its exit code; a refusal of one of the job's keys (data.path's
// folder, say) names the file and line that wrote it (config::located_errors).
int run_model_job(const std::string& file, const std::vector<std::string>& overrides,
                  const std::string& device, const std::function<int(Job)>& run);

}  // namespace dtrain::cli
