// The layout planner (runtime/plan.h): enumerate, estimate, model, rank.
#include "runtime/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace dtrain::runtime {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

// Micro-batch sizes worth trying for `per_rank` samples per data rank per step: its
// power-of-two divisors and itself.
std::vector<int64_t> micro_sizes(int64_t per_rank) {
  std::vector<int64_t> out;
  for (int64_t b = 1; b <= per_rank; b *= 2)
    if (per_rank % b == 0) out.push_back(b);
  if (out.empty() || out.back() != per_rank) out.push_back(per_rank);
  return out;
}

// The step time of a layout whose estimate is `e` (runtime/plan.h's model).
void model_step(const Cluster& c, const Job& v, const MemoryEstimate& e, LayoutPlan& l) {
  const double rate = c.peak_flops * c.efficiency;
  const double forward = e.forward_flops / rate;  // one micro-batch, the worst stage
  // Forward, backward at twice forward less what optimizer.freeze skips, the recompute.
  const double passes = 1.0 + 2.0 * e.backward_share + (l.checkpointing ? 1.0 : 0.0);
  const double fixed = 3.0 * e.forward_param_bytes / c.memory_bandwidth +
                       passes * static_cast<double>(e.forward_ops) * c.launch;
  const double per_micro = forward * passes + fixed;
  const int p = l.pipeline, m = l.micro_batches;
  l.compute = (m + p - 1) * per_micro;
  l.bubble = (p - 1) * per_micro;
  const int dpn = c.devices_per_node;
  // Tensor innermost: a tensor group is t neighbouring ranks. pp_dp_tp: a data group is
  // the ranks t apart inside a stage's block of d x t; stage s holds ranks [s dt,
  // (s + 1) dt), so some cut crosses nodes once the pipeline spans more than one node
  // (the slowest cut sets the pace). dp_pp_tp: a replica's p x t ranks are neighbours
  // and its stage groups p t ranks apart.
  l.tensor_inter = l.tensor > dpn;
  if (l.order == GridOrder::dp_pp_tp) {
    l.pipeline_inter = p > 1 && p * l.tensor > dpn;
    l.data_inter = l.data > 1 && p * l.data * l.tensor > dpn;
  } else {
    l.data_inter = l.data * l.tensor > dpn;
    l.pipeline_inter = p > 1 && p * l.data * l.tensor > dpn;
  }
  const Link& tl = l.tensor_inter ? c.inter : c.intra;
  const Link& dl = l.data_inter ? c.inter : c.intra;
  const Link& pl = l.pipeline_inter ? c.inter : c.intra;
  if (l.tensor > 1) {
    l.tensor_comm = e.comm.tensor / tl.bandwidth +
                    static_cast<double>(e.comm.tensor_calls) * 2.0 * (l.tensor - 1) * tl.latency;
  }
  if (l.data > 1) {
    const double all = e.comm.data / dl.bandwidth + 2.0 * (l.data - 1) * dl.latency;
    l.data_comm = std::max(0.0, all - 2.0 * forward);  // hidden behind the last backward
  }
  if (p > 1) l.pipeline_comm = e.comm.pipeline / pl.bandwidth + 4.0 * m * pl.latency;
  l.step = l.compute + l.tensor_comm + l.data_comm + l.pipeline_comm;
  l.samples_per_s = static_cast<double>(v.data.global_batch) / l.step;
  const std::pair<double, const char*> parts[] = {
      {l.compute - l.bubble, "compute"},
      {l.bubble, "the pipeline bubble"},
      {l.tensor_comm, l.tensor_inter ? "tensor all-reduces between nodes" : "tensor all-reduces"},
      {l.data_comm,
       l.data_inter ? "the gradient all-reduce between nodes" : "the gradient all-reduce"},
      {l.pipeline_comm, l.pipeline_inter ? "stage exchanges between nodes" : "stage exchanges"}};
  const auto* top = std::max_element(std::begin(parts), std::end(parts));
  l.why = fmt::format("{:.0f}% {}", 100.0 * top->first / l.step, top->second);
}

}  // namespace

PlanResult plan_layouts(const Job& job, const Cluster& cluster) {
  const int world = cluster.world();
  const int64_t global = job.data.global_batch;
  PlanResult out;
  std::map<std::string, int> reasons;  // skipped layouts by reason
  const bool compressed = job.compress.method != CompressMethod::none;
  for (int t : divisors(world)) {
    if (t > cluster.devices_per_node) continue;  // a tensor group stays inside a node
    for (int p : divisors(world / t)) {
      const int d = world / (t * p);
      // Gradient compression runs over data ranks, without ZeRO-2/3.
      if (compressed && d == 1) {
        ++reasons[fmt::format("pipeline {} x tensor {}: compress.method needs data ranks", p, t)];
        continue;
      }
      if (global % d != 0) {
        ++reasons[fmt::format("data {}: does not divide data.global_batch = {}", d, global)];
        continue;
      }
      for (int64_t mb : micro_sizes(global / d)) {
        // The ZeRO stages dtrain train takes for this grid (none without data ranks).
        const int zero_max = d == 1 ? 0 : p > 1 || compressed ? 1 : 3;
        for (int z = 0; z <= zero_max; ++z) {
          for (const GridOrder order : {GridOrder::pp_dp_tp, GridOrder::dp_pp_tp}) {
            if (order == GridOrder::dp_pp_tp && (p == 1 || d == 1)) continue;  // the same
            for (const bool ckpt : {false, true}) {
              Job v = job;
              v.parallel.pipeline = p;
              v.parallel.data = d;
              v.parallel.tensor = t;
              v.parallel.pipeline_blocks.reset();
              v.parallel.zero_stage = z;
              v.parallel.order = order;
              v.data.micro_batch = mb;
              v.parallel.micro_batches = static_cast<int>(global / (d * mb));
              v.memory.checkpointing =
                  ckpt ? ActivationCheckpointing::block : ActivationCheckpointing::none;
              LayoutPlan l;
              l.pipeline = p;
              l.data = d;
              l.tensor = t;
              l.zero_stage = z;
              l.order = order;
              l.micro_batch = static_cast<int>(mb);
              l.micro_batches = v.parallel.micro_batches;
              l.checkpointing = ckpt;
              MemoryEstimate e;
              try {
                e = estimate_memory(v);
              } catch (const Error& err) {  // heads a tensor degree does not divide, ...
                ++reasons[fmt::format("pipeline {} x tensor {}: {}", p, t, err.message())];
                continue;
              }
              ++out.considered;
              l.peak_bytes = e.peak_bytes;
              l.comm = e.comm;
              l.fits = static_cast<double>(e.peak_bytes) <= cluster.memory_bytes;
              model_step(cluster, v, e, l);
              if (!l.fits) {
                l.why =
                    fmt::format("needs {} of {}", format_bytes(static_cast<double>(l.peak_bytes)),
                                format_bytes(cluster.memory_bytes));
              }
              l.sets = {fmt::format("parallel.pipeline={}", p),
                        fmt::format("parallel.data={}", d),
                        fmt::format("parallel.tensor={}", t),
                        fmt::format("parallel.zero_stage={}", z),
                        fmt::format("data.micro_batch={}", mb),
                        fmt::format("memory.checkpointing={}", ckpt ? "block" : "none")};
              if (p > 1 && d > 1)
                l.sets.push_back(fmt::format("parallel.order={}", to_string(order)));
              out.layouts.push_back(std::move(l));
            }
          }
        }
      }
    }
  }
  for (const auto& [reason, n] : reasons)
    out.skipped.push_back(fmt::format("{} ({} layout(s))", reason, n));
  if (out.layouts.empty()) {
    throw Error(fmt::format("dtrain plan: no layout of this job runs on {} devices{}", world,
                            out.skipped.empty() ? "" : ": " + out.skipped.front()),
                "change the cluster's nodes / devices_per_node or data.global_batch");
  }
  std::stable_sort(out.layouts.begin(), out.layouts.end(),
                   [](const LayoutPlan& a, const LayoutPlan& b) {
                     if (a.fits != b.fits) return a.fits;
                     return a.fits ? a.step < b.step : a.peak_bytes < b.peak_bytes;
                   });
  return out;
}

std::string format_plan(const PlanResult& plan, const Cluster& c, int top) {
  std::string out = fmt::format(
      "{} layouts of {} devices ({} node(s) x {}; {} and {:.3g} TFLOP/s x {} each; links "
      "{}/s inside a node, {}/s between nodes) estimated, {} fit\n",
      plan.considered, c.world(), c.nodes, c.devices_per_node, format_bytes(c.memory_bytes),
      c.peak_flops / 1e12, c.efficiency, format_bytes(c.intra.bandwidth),
      format_bytes(c.inter.bandwidth),
      std::count_if(plan.layouts.begin(), plan.layouts.end(),
                    [](const LayoutPlan& l) { return l.fits; }));
  out += fmt::format("  {:>3} {:>14} {:>4} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {}\n",
                     "#", "pp x dp x tp", "zero", "micro", "ckpt", "memory", "step", "samples/s",
                     "data", "tensor", "pipeline", "dominated by");
  int shown = 0;
  for (const LayoutPlan& l : plan.layouts) {
    if (shown++ >= top) break;
    out += fmt::format(
        "  {:>3} {:>14} {:>4} {:>6} {:>5} {:>9} {:>9} {:>9.1f} {:>9} {:>9} {:>9}  {}\n", shown,
        fmt::format("{}{} x {} x {}", l.order == GridOrder::dp_pp_tp ? "*" : "", l.pipeline, l.data,
                    l.tensor),
        l.zero_stage, fmt::format("{}x{}", l.micro_batches, l.micro_batch),
        l.checkpointing ? "block" : "none", format_bytes(static_cast<double>(l.peak_bytes)),
        format_seconds(l.step), l.samples_per_s, format_bytes(l.comm.data),
        format_bytes(l.comm.tensor), format_bytes(l.comm.pipeline),
        l.fits ? l.why : "does not fit: " + l.why);
  }
  if (plan.layouts.front().fits) {
    out += "run the first with:\n  dtrain train JOB.yaml --nproc " + std::to_string(c.world());
    for (const std::string& s : plan.layouts.front().sets) out += " --set " + s;
    out += "\n";
  } else {
    out += "none fits: the first needs the least memory per device\n";
  }
  for (const std::string& s : plan.skipped) out += "skipped: " + s + "\n";
  out += "*: parallel.order dp_pp_tp (a replica's stages neighbours, inside a node)\n";
  out +=
      "model: compute at peak x efficiency, a pipeline's (m + p - 1) slots of its slowest stage; "
      "tensor all-reduces not overlapped; the gradient all-reduce overlapped with the last "
      "backward; stage exchanges on the critical path; a message costs bytes / bandwidth + "
      "latency (data, tensor, pipeline: bytes each rank moves per step)\n";
  return out;
}

}  // namespace dtrain::runtime
