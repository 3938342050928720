// `dtrain estimate JOB.yaml [--set key.path=value ...] [--world N] [--device D] [--json]
// [--fit SIZE]`: loads and
// checks a job file as `dtrain train` would, then prints the memory one rank will
// hold (runtime/estimate.h) without allocating a tensor or touching a device, and the
// roofline step time (runtime/roofline.h), a lower bound from the device's peaks.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "config/config.h"
#include "models/registry.h"
#include "runtime/estimate.h"
#include "runtime/param_groups.h"

namespace dtrain::cli {
namespace {

struct EstimateArgs {
  std::string job;
  std::vector<std::string> overrides;
  int world = 0;
  std::string device;  // "cuda": as --set device=cuda (the job's otherwise)
  bool json = false;
  std::string fit;  // "80GB": the smallest change that fits
};

nlohmann::json to_json(const runtime::MemoryEstimate& e) {
  auto items = [](const std::vector<runtime::MemoryItem>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const runtime::MemoryItem& i : list)
      out.push_back({{"kind", i.kind}, {"bytes", i.bytes}, {"note", i.note}});
    return out;
  };
  nlohmann::json out = {{"state", items(e.state)},
                        {"state_bytes", e.state_bytes},
                        {"host", items(e.host)},
                        {"host_bytes", e.host_bytes},
                        {"train_activation_bytes", e.train.peak},
                        {"train_peak_at", e.train_peak_at},
                        {"eval_activation_bytes", e.eval.peak},
                        {"eval_peak_at", e.eval_peak_at},
                        {"peak_bytes", e.peak_bytes},
                        {"peak_at", e.peak_at},
                        {"step_flops", e.step_flops}};
  if (!e.stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (const runtime::MemoryEstimate::Stage& st : e.stages)
      stages.push_back({{"stage", st.stage},
                        {"in_flight", st.in_flight},
                        {"train_activation_bytes", st.train},
                        {"eval_activation_bytes", st.eval},
                        {"peak_bytes", st.peak},
                        {"train_peak_at", st.at}});
    out["pipeline_stages"] = stages;
  }
  if (!e.caveat.empty()) out["caveat"] = e.caveat;
  out["comm_bytes_per_step"] = {{"data", e.comm.data},
                                {"tensor", e.comm.tensor},
                                {"tensor_all_reduces", e.comm.tensor_calls},
                                {"pipeline", e.comm.pipeline},
                                {"data_compressed", e.comm.compressed}};
  if (e.comm.compressed) out["comm_bytes_per_step"]["data_dense"] = e.comm.data_dense;
  if (e.step_time) {
    const runtime::StepTimeEstimate& t = *e.step_time;
    out["step_seconds"] = t.seconds;  // the roofline's lower bound
    out["step_time"] = {{"seconds", t.seconds},
                        {"compute_bound_seconds", t.compute_bound_seconds},
                        {"memory_bound_seconds", t.memory_bound_seconds},
                        {"recompute_seconds", t.recompute_seconds},
                        {"optimizer_seconds", t.optimizer_seconds},
                        {"offload_seconds", t.offload_seconds},
                        {"flops", t.flops},
                        {"bytes", t.bytes},
                        {"source", t.source}};
  } else {
    out["step_seconds"] = nullptr;
    out["step_time_missing"] = e.step_time_missing;
  }
  return out;
}

int estimate_job(const EstimateArgs& args, const Job& job, const config::ValidateContext& ctx);

int run_estimate(const EstimateArgs& args) {
  std::vector<std::string> warnings;
  config::ValidateContext ctx;
  ctx.world_size = args.world > 0 ? args.world : world_from_env();
  ctx.warnings = &warnings;
  std::vector<std::string> overrides = args.overrides;
  add_device_override(args.device, overrides);
  config::SourceMap where;
  const Job job = config::load_job_file(args.job, overrides, ctx, &where);
  for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
  int rc = kExitOk;
  config::located_errors(where, [&] { rc = estimate_job(args, job, ctx); });
  return rc;
}

// The estimate of a loaded job (refusals of the model's and data's name their keys).
int estimate_job(const EstimateArgs& args, const Job& job, const config::ValidateContext& ctx) {
  if (const int threads = assume_rank_threads(ctx.world_size, job.comm.ranks_per_node.value_or(0)))
    std::fprintf(stderr,
                 "dtrain: note: sized for %d OpenMP thread(s) per rank, as --nproc runs the "
                 "ranks of one machine (OMP_NUM_THREADS sizes for another count)\n",
                 threads);
  if (models::find_model(job.model.arch) == nullptr) {
    throw Error(fmt::format("model.arch: {} has no graph builder yet, so nothing to estimate",
                            job.model.arch),
                "pick an architecture `dtrain train` can build");
  }
  if (!job.optimizer.freeze.empty() || job.optimizer.layer_decay ||
      !job.optimizer.groups.empty()) {  // train's refusals too
    const models::ModelGraph m = models::build_model(job.model, 1);
    const runtime::ParamGroups checked(job.optimizer, m.graph, job.model.arch);  // or exit 2
  }
  runtime::EstimateOptions options;
  options.step_time = true;  // only here: on the CPU it measures the host's peaks first
  const runtime::MemoryEstimate e = runtime::estimate_memory(job, options);
  std::optional<runtime::FitAdvice> fit;
  size_t capacity = 0;
  if (!args.fit.empty()) {
    capacity = runtime::parse_bytes(args.fit, "--fit");
    fit = runtime::fit_memory(job, capacity);
  }
  if (args.json) {
    nlohmann::json out = to_json(e);
    if (fit) {
      out["fit"] = {{"capacity_bytes", capacity},
                    {"fits", fit->fits},
                    {"sets", fit->sets},
                    {"peak_bytes", fit->estimate.peak_bytes}};
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::fputs(runtime::format_estimate(e).c_str(), stdout);
    if (fit) std::fputs(runtime::format_fit(*fit, capacity).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace

void add_weights_option(CLI::App* cmd, std::string& which) {
  cmd->add_option("--weights", which,
                  "of a checkpoint: ema (optimizer.ema's average of the weights), model (the "
                  "weights the optimizer stepped) or auto (default: the average when the "
                  "checkpoint holds one)")
      ->check(CLI::IsMember({"auto", "model", "ema"}));
}

void add_device_override(const std::string& device, std::vector<std::string>& overrides) {
  if (device.empty()) return;
  try {
    Device::parse(device);  // named as the user wrote it, not as the --set it becomes
  } catch (const Error& e) {
    throw Error(fmt::format("--device {}: {}", device, e.message()), e.hint());
  }
  overrides.push_back("device=" + device);
}

void add_estimate(CLI::App& app, Action& action) {
  auto args = std::make_shared<EstimateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "estimate",
      "print the memory one rank of a job holds and a lower bound on its step time, without "
      "running it");
  cmd->add_option("job", args->job, "job file (YAML)")->required();
  cmd->add_option("--set", args->overrides,
                  "override a key, e.g. --set data.micro_batch=8 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--world", args->world, "world size (default: the launcher's, else 1)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--device", args->device,
                  "cpu, cuda or cuda:N: estimate for that device instead of the job's (a GPU "
                  "need not be present)");
  cmd->add_flag("--json", args->json, "print JSON instead of the table");
  cmd->add_option("--fit", args->fit,
                  "a memory size per rank (80GB, 24GiB): print the smallest change to the job "
                  "that fits it, as --set overrides");
  cmd->callback([args, &action] { action = [args] { return run_estimate(*args); }; });
}

}  // namespace dtrain::cli
