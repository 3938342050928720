// See estimate.h: dtrain estimate --fit's advice, a rank's memory capacity, and the
// printed estimate (estimate.cpp computes it).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/device_info.h"
#include "runtime/estimate.h"

namespace dtrain::runtime {

FitAdvice fit_memory(const Job& job, size_t capacity) {
  FitAdvice a;
  a.estimate = estimate_memory(job);
  if (a.estimate.peak_bytes <= capacity) {
    a.fits = true;
    return a;
  }
  // Smaller micro-batches (more accumulation: the same global batch and result) down
  // to half the job's, without checkpointing; then block checkpointing (exact, about a
  // quarter more compute) from the job's micro-batch down; on CUDA then optimizer
  // offload (a host step each iteration), alone down to half the micro-batch and then
  // with checkpointing; then smaller micro-batches still. The first that fits wins.
  const int64_t per_step = job.data.global_batch / job.parallel.data;  // samples per rank
  const bool checkpointed = job.memory.checkpointing != ActivationCheckpointing::none;
  const bool can_offload = job.device.is_cuda() && !job.memory.offload.optimizer;
  // ZeRO first where it applies: ZeRO-1 gives the same result (SGD and AdamW update
  // each element alone) for about the same traffic, ZeRO-2 too with one micro-batch
  // per rank (within rounding with more); the stage that was tried last stays in every
  // later candidate.
  // The stages the trainer takes: ZeRO-1 in a pipeline, every stage otherwise.
  const int zero_max = job.parallel.pipeline > 1 ? 1 : 3;
  const bool half_ok =
      compute_dtype(job.precision.dtype) == DType::f32 || job.precision.master_weights;
  const bool can_zero =
      job.parallel.data > 1 && job.parallel.zero_stage < std::min(2, zero_max) && half_ok;
  const bool can_zero3 =
      job.parallel.data > 1 && job.parallel.zero_stage < 3 && zero_max >= 3 && half_ok;
  int use_zero = 0;
  auto fits_with = [&](int64_t mb, bool add_checkpointing, bool add_offload) {
    Job changed = job;
    changed.data.micro_batch = mb;
    changed.parallel.micro_batches = static_cast<int>(per_step / mb);
    a.sets.clear();
    if (use_zero > 0) {  // ZeRO-Offload when offload joins
      changed.parallel.zero_stage = use_zero;
      a.sets = {"--set", fmt::format("parallel.zero_stage={}", use_zero)};
    }
    if (mb != job.data.micro_batch) {
      a.sets.insert(a.sets.end(),
                    {"--set", fmt::format("data.micro_batch={}", mb), "--set",
                     fmt::format("parallel.micro_batches={}", changed.parallel.micro_batches)});
    }
    if (add_checkpointing) {
      changed.memory.checkpointing = ActivationCheckpointing::block;
      a.sets.insert(a.sets.end(), {"--set", "memory.checkpointing=block"});
    }
    if (add_offload) {
      changed.memory.offload.optimizer = true;
      a.sets.insert(a.sets.end(), {"--set", "memory.offload.optimizer=true"});
    }
    a.estimate = estimate_memory(changed);
    a.fits = a.estimate.peak_bytes <= capacity;
    return a.fits;
  };
  const int64_t job_mb = job.data.micro_batch;
  if (can_zero) {
    for (int stage = job.parallel.zero_stage + 1; stage <= std::min(2, zero_max); ++stage) {
      use_zero = stage;
      if (fits_with(job_mb, false, false)) return a;
    }
  }
  for (int64_t mb = job_mb - 1; 2 * mb >= job_mb; --mb)
    if (per_step % mb == 0 && fits_with(mb, false, false)) return a;
  if (!checkpointed) {
    for (int64_t mb = job_mb; mb >= 1; --mb)
      if (per_step % mb == 0 && fits_with(mb, true, false)) return a;
  }
  // ZeRO-3: the parameters sharded too (the same result, half again the traffic),
  // with the job's micro-batch, then with checkpointing.
  if (can_zero3) {
    use_zero = 3;
    if (fits_with(job_mb, false, false)) return a;
    if (!checkpointed && fits_with(job_mb, true, false)) return a;
  }
  if (can_offload) {
    for (int64_t mb = job_mb; 2 * mb >= job_mb; --mb)
      if (per_step % mb == 0 && fits_with(mb, false, true)) return a;
    if (!checkpointed) {
      for (int64_t mb = job_mb; mb >= 1; --mb)
        if (per_step % mb == 0 && fits_with(mb, true, true)) return a;
    }
  }
  for (int64_t mb = (job_mb + 1) / 2 - 1; mb >= 1; --mb)
    if (per_step % mb == 0 && fits_with(mb, false, false)) return a;
  if (can_offload) {
    for (int64_t mb = (job_mb + 1) / 2 - 1; mb >= 1; --mb)
      if (per_step % mb == 0 && fits_with(mb, false, true)) return a;
  }
  fits_with(1, !checkpointed, can_offload);  // report the smallest configuration tried
  return a;
}

std::string format_fit(const FitAdvice& a, size_t capacity) {
  if (a.fits && a.sets.empty())
    return fmt::format("fits in {} as it is (peak {})\n", format_bytes(capacity),
                       format_bytes(a.estimate.peak_bytes));
  std::string sets;
  for (size_t i = 0; i + 1 < a.sets.size(); i += 2) sets += " " + a.sets[i] + " " + a.sets[i + 1];
  if (a.fits) {
    return fmt::format("fits in {} with:{} (peak {}; the same global batch and result)\n",
                       format_bytes(capacity), sets, format_bytes(a.estimate.peak_bytes));
  }
  return fmt::format(
      "does not fit in {} even at micro-batch 1 with checkpointing{} (peak {}: the model state "
      "alone is {}); a smaller model, or more data-parallel ranks with ZeRO, are what is "
      "left\n",
      format_bytes(capacity), a.estimate.host.empty() ? "" : " and optimizer offload",
      format_bytes(a.estimate.peak_bytes), format_bytes(a.estimate.state_bytes));
}

size_t rank_capacity(const Job& job, int local_ranks) {
  if (job.device.is_cuda()) {
    const kernels::CudaInfo cuda = kernels::query_cuda();
    for (const kernels::CudaDeviceInfo& d : cuda.devices)
      if (d.index == job.device.index) return d.total_memory;
    return 0;
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    size_t kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") return kb * 1024 / static_cast<size_t>(std::max(1, local_ranks));
    meminfo.ignore(1 << 10, '\n');
  }
  return 0;  // unknown: the caller skips the check
}

size_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"kB", 1e3},
                                                  {"KB", 1e3},
                                                  {"MB", 1e6},
                                                  {"GB", 1e9},
                                                  {"TB", 1e12},
                                                  {"KiB", 1024.0},
                                                  {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0},
                                                  {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : units) {
    if (used > 0 && unit == name && value > 0) return static_cast<size_t>(value * scale);
  }
  throw Error(fmt::format("{}: \"{}\" is not a size", what, text),
              "write a number with a unit: 80GB, 24GiB, 512MB (or plain bytes)");
}

std::string format_estimate(const MemoryEstimate& e) {
  std::string out = "memory per rank (estimate)\n";
  size_t w = 22;  // the kind column: the longest kind's width
  for (const std::vector<MemoryItem>* items : {&e.state, &e.host})
    for (const MemoryItem& i : *items) w = std::max(w, i.kind.size());
  const auto row = [&](std::string_view kind, size_t bytes, std::string_view note) {
    return fmt::format("  {:<{}} {:>10}{}{}\n", kind, w, format_bytes(bytes),
                       note.empty() ? "" : "  ", note);
  };
  for (const MemoryItem& i : e.state) out += row(i.kind, i.bytes, i.note);
  out += row("state total", e.state_bytes, "");
  out += row("activations (train)", e.train.peak, "at " + e.train_peak_at);
  out += row("activations (eval)", e.eval.peak, "at " + e.eval_peak_at);
  out += row("peak", e.peak_bytes, "at " + e.peak_at);
  if (!e.host.empty()) {
    out += "host memory per rank (memory.offload.optimizer, pinned)\n";
    for (const MemoryItem& i : e.host) out += row(i.kind, i.bytes, i.note);
    out += row("host total", e.host_bytes, "");
  }
  out += fmt::format("compute: {:.3g} FLOPs per step (forward + backward, every micro-batch)\n",
                     e.step_flops);
  for (const MemoryEstimate::Stage& s : e.stages) {
    out += fmt::format(
        "  stage {}: {} micro-batch(es) in flight, activations {} (train, at {}), "
        "{} (eval), peak {}\n",
        s.stage, s.in_flight, format_bytes(s.train), s.at, format_bytes(s.eval),
        format_bytes(s.peak));
  }
  std::string comm;
  if (e.comm.data > 0)
    comm += fmt::format(
        ", data {} ({})", format_bytes(static_cast<size_t>(e.comm.data)),
        e.comm.compressed ? fmt::format("the compressed gradient exchange; {} without compression",
                                        format_bytes(static_cast<size_t>(e.comm.data_dense)))
        : e.comm.zero_stage == 1
            ? std::string("ZeRO-1: gradients reduced into their owners, the stepped parameters "
                          "gathered: an all-reduce's bytes")
        : e.comm.zero_stage == 2
            ? std::string("ZeRO-2: every micro-batch's gradients reduced into their owners, "
                          "the stepped parameters gathered")
        : e.comm.zero_stage >= 3
            ? std::string("ZeRO-3: every micro-batch's gradients reduced into their owners, "
                          "the parameters gathered for every pass")
            : std::string("the gradient all-reduce"));
  if (e.comm.tensor > 0) {
    comm += fmt::format(", tensor {} ({} all-reduces of activations and their gradients)",
                        format_bytes(static_cast<size_t>(e.comm.tensor)), e.comm.tensor_calls);
  }
  if (e.comm.pipeline > 0) {
    comm += fmt::format(", pipeline {} (the busiest stage's sends and receives)",
                        format_bytes(static_cast<size_t>(e.comm.pipeline)));
  }
  if (!comm.empty()) out += "communication per step and rank:" + comm.substr(1) + "\n";
  if (!e.caveat.empty()) out += "note: " + e.caveat + "\n";
  if (e.step_time) {
    const StepTimeEstimate& t = *e.step_time;
    const bool offload = t.offload_seconds > 0;
    out += fmt::format(
        "step time: >= {} per step (roofline lower bound: each op at the peak FLOP/s or "
        "bandwidth, no communication, launch or framework time)\n"
        "  {} compute-bound, {} memory-bound{}; of which {} recompute, {} optimizer{}\n"
        "  peaks: {}\n",
        format_seconds(t.seconds), format_seconds(t.compute_bound_seconds),
        format_seconds(t.memory_bound_seconds),
        offload ? fmt::format(", {} PCIe transfers (gradients down, parameters up)",
                              format_seconds(t.offload_seconds))
                : std::string(),
        format_seconds(t.recompute_seconds), format_seconds(t.optimizer_seconds),
        offload ? " (the host's step included)" : "", t.source);
  } else if (!e.step_time_missing.empty()) {
    out += e.step_time_missing + "\n";
  }
  return out;
}

}  // namespace dtrain::runtime
