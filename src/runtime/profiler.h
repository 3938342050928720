// The profiler: one code path for the Chrome trace of a training run
// (logging.profile: {start, steps} -> <output_dir>/trace-rank-N.json, opens in Perfetto
// or chrome://tracing) and for bench_model's per-op table. While attached to an
// executor it times every node's forward, backward and recompute (on CUDA the device
// is synchronised at each op boundary so a span is the device's time, and each span
// is also an NVTX range for Nsight); detached, the executor's hooks are what they were
// and nothing is measured. Spans carry the op's kind, FLOPs and bytes (the roofline's
// count, runtime/roofline.h); the trainer adds the step, the data-loader waits, the
// optimizer, each gradient bucket's exchange on its own track, and memory counters.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "graph/executor.h"
#include "runtime/job.h"

namespace dtrain::runtime {

class Profiler {
 public:
  // Tracks (Chrome trace thread ids): the training thread, a pipeline stage's micro-batch
  // passes and its exchanges with the neighbouring stages, then one per bucket.
  static constexpr int kMainTrack = 1;
  static constexpr int kPipelineTrack = 2;
  static constexpr int kExchangeTrack = 3;
  static constexpr int kBucketTrack0 = 100;

  Profiler(const graph::Graph& graph, Device device, int rank);

  // Installs the timing hooks on `ex` (chained after the ones there) / restores them.
  void attach(graph::Executor& ex);
  void detach();
  bool attached() const { return ex_ != nullptr; }
  // Spans go into the trace only while tracing (bench_model: timing alone).
  void set_tracing(bool on) { tracing_ = on; }

  // Seconds since the profiler's origin (steady clock), and a steady_clock time in
  // seconds since its epoch converted to the same scale (GradSync's bucket times).
  double now() const;
  double from_steady(double steady_seconds) const;
  // A finished span [start, end) in seconds on `track`.
  void span(const std::string& name, const std::string& category, int track, double start,
            double end, nlohmann::json args = nlohmann::json::object());
  // A counter sample ("memory": {"host_bytes": ..., "device_bytes": ...}).
  void counter(const std::string& name, nlohmann::json values);
  void name_track(int track, const std::string& name);

  // A span from construction to destruction on the main track (steps, data waits, the
  // optimizer). Inactive (no timing at all) when the profiler is not tracing.
  class Scope {
   public:
    Scope(Profiler* p, std::string name, std::string category, nlohmann::json args = {});
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler* p_;
    std::string name_, category_;
    nlohmann::json args_;
    double start_ = 0;
  };

  // Per-node seconds summed over every timed op since construction (forward and
  // recompute in forward, backward in backward): bench_model's per-op table.
  const std::vector<double>& forward_seconds() const { return fwd_; }
  const std::vector<double>& backward_seconds() const { return bwd_; }

  // The trace so far as Chrome's JSON object format; written atomically.
  void write(const std::filesystem::path& file) const;
  size_t events() const { return events_.size(); }

 private:
  void op_begin(int node, graph::Phase phase);
  void op_end(int node, graph::Phase phase);

  const graph::Graph& graph_;
  Device device_;
  int rank_;
  std::chrono::steady_clock::time_point origin_;
  graph::Executor* ex_ = nullptr;
  graph::Hooks saved_;  // the executor's hooks before attach()
  bool tracing_ = true;
  double op_start_ = 0;
  std::vector<double> fwd_, bwd_;
  std::vector<double> node_flops_, node_bytes_;
  std::vector<double> bwd_passes_;  // per node: runtime::backward_passes, set by attach
  nlohmann::json events_ = nlohmann::json::array();
  std::set<int> named_;  // tracks given a name
};

// logging.profile in a training run, the step's profiling stage: steps are numbered as
// in metrics.jsonl (from 1; start 0 means the first). At the window's first step the
// profiler is made and attached (with the bucket exchanges of data parallelism's
// GradSync or ZeRO-2's ShardedGradSync on their tracks); after its last step (or the run's last, or
// a stop) it is detached and the trace written to `file`.
class ProfileWindow {
 public:
  ProfileWindow(const ProfileOptions& o, const graph::Graph& graph, Device device, int rank,
                std::filesystem::path file);
  bool covers(int64_t step) const;
  // Before step `step`; `sync`: the buckets to trace (null: none, one rank).
  void before(int64_t step, graph::Executor& ex, dist::TracedBuckets* sync);
  // After it: the note saying where the trace went when it was written, else "".
  std::string after(int64_t step, bool last, dist::TracedBuckets* sync);
  // For Profiler::Scope: null before the window (a Scope is inactive unless attached).
  Profiler* profiler() const { return profiler_.get(); }

 private:
  ProfileOptions o_;
  const graph::Graph& graph_;
  Device device_;
  int rank_;
  std::filesystem::path file_;
  std::unique_ptr<Profiler> profiler_;
  int64_t first_ = 0;  // the first step traced (later than the window's in a resumed run)
};

}  // namespace dtrain::runtime
