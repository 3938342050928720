// `dtrain plan JOB.yaml --cluster CLUSTER.yaml [--set key=value ...] [--top N] [--json]`:
// the layouts of the job over the cluster's devices that fit, ranked by a modelled
// step time (runtime/plan.h), each as the --set lines `dtrain train` takes.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "models/registry.h"
#include "runtime/estimate.h"
#include "runtime/plan.h"

namespace dtrain::cli {

namespace {

struct PlanArgs {
  std::string job, cluster;
  std::vector<std::string> overrides;
  int top = 5;
  bool json = false;
};

nlohmann::json to_json(const runtime::LayoutPlan& l) {
  return {{"pipeline", l.pipeline},
          {"data", l.data},
          {"tensor", l.tensor},
          {"zero_stage", l.zero_stage},
          {"micro_batch", l.micro_batch},
          {"micro_batches", l.micro_batches},
          {"checkpointing", l.checkpointing},
          {"peak_bytes", l.peak_bytes},
          {"fits", l.fits},
          {"step_seconds", l.step},
          {"compute_seconds", l.compute},
          {"bubble_seconds", l.bubble},
          {"tensor_seconds", l.tensor_comm},
          {"data_seconds", l.data_comm},
          {"pipeline_seconds", l.pipeline_comm},
          {"samples_per_s", l.samples_per_s},
          {"comm_bytes_per_step",
           {{"data", l.comm.data}, {"tensor", l.comm.tensor}, {"pipeline", l.comm.pipeline}}},
          {"sets", l.sets},
          {"why", l.why}};
}

int run_plan(const PlanArgs& args) {
  const runtime::Cluster cluster = config::load_cluster_file(args.cluster);
  // The job as written on one rank: the planner sets every layout key itself.
  config::ValidateContext ctx;
  std::vector<std::string> overrides = {"parallel.pipeline=1", "parallel.tensor=1",
                                        "parallel.data=1", "parallel.zero_stage=0"};
  // The keys the planner sets itself for every layout: a --set of one (or of the section
  // holding it) would be overwritten or clash, so it is refused by name.
  const std::vector<std::string> chosen = {
      "parallel.pipeline",        "parallel.tensor",  "parallel.data",
      "parallel.zero_stage",      "parallel.order",   "parallel.micro_batches",
      "parallel.pipeline_blocks", "data.micro_batch", "memory.checkpointing"};
  for (const std::string& o : args.overrides) {
    const std::string key = o.substr(0, o.find('='));
    for (const std::string& c : chosen) {
      if (key == c || c.rfind(key + ".", 0) == 0) {
        throw Error(fmt::format("--set {}: dtrain plan chooses {} itself, for every layout it "
                                "ranks",
                                o, c),
                    "drop the --set; plan lists the layouts with that key's other values too "
                    "(--top N shows more of them)");
      }
    }
  }
  overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
  const Job job = config::load_job_file(args.job, overrides, ctx);
  if (models::find_model(job.model.arch) == nullptr) {
    throw Error(
        fmt::format("model.arch: {} has no graph builder yet, so nothing to plan", job.model.arch),
        "pick an architecture `dtrain train` can build");
  }
  const runtime::PlanResult plan = runtime::plan_layouts(job, cluster);
  if (args.json) {
    nlohmann::json layouts = nlohmann::json::array();
    for (const runtime::LayoutPlan& l : plan.layouts) layouts.push_back(to_json(l));
    const nlohmann::json out = {{"devices", cluster.world()},
                                {"considered", plan.considered},
                                {"layouts", layouts},
                                {"skipped", plan.skipped}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::fputs(runtime::format_plan(plan, cluster, args.top).c_str(), stdout);
  }
  if (!plan.layouts.front().fits) {  // sorted: a layout that fits comes first
    throw RunError(
        fmt::format("no layout of this job fits in the {} of one device of the "
                    "cluster (the least memory any needs: {})",
                    runtime::format_bytes(static_cast<double>(cluster.memory_bytes)),
                    runtime::format_bytes(static_cast<double>(plan.layouts.front().peak_bytes))),
        "give the cluster more devices or memory, or shrink the job "
        "(data.global_batch, model size)");
  }
  return kExitOk;
}

}  // namespace

void add_plan(CLI::App& app, Action& action) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "rank the layouts (pipeline x data x tensor, ZeRO, micro-batch, checkpointing) of a job "
      "over a cluster's devices by a modelled step time, keeping those that fit");
  cmd->add_option("job", args->job, "job file (YAML)")->required();
  cmd->add_option("--cluster", args->cluster,
                  "cluster file (YAML): nodes, devices_per_node, device {memory_gb, "
                  "peak_tflops[, efficiency]}, links {intra_node, inter_node} each "
                  "{bandwidth_gb_s, latency_us}")
      ->required();
  cmd->add_option("--set", args->overrides, "override a job key (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--top", args->top, "layouts to print (default 5)")->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", args->json, "print every layout as JSON instead of the table");
  cmd->callback([args, &action] { action = [args] { return run_plan(*args); }; });
}

}  // namespace dtrain::cli
