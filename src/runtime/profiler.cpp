// See profiler.h. The trace is Chrome's "JSON object format": complete events
// ("ph": "X", microseconds), counters ("C") and thread names ("M"), one process per
// rank (pid = rank).
#include "runtime/profiler.h"

#include "core/allocator.h"
#include "data/atomic_file.h"
#include "kernels/memory.h"
#include "kernels/trace.h"
#include "runtime/roofline.h"

namespace dtrain::runtime {

namespace {

const char* phase_name(graph::Phase p) {
  switch (p) {
    case graph::Phase::forward:
      return "forward";
    case graph::Phase::backward:
      return "backward";
    case graph::Phase::recompute:
      return "recompute";
  }
  return "?";
}

}  // namespace

Profiler::Profiler(const graph::Graph& graph, Device device, int rank)
    : graph_(graph),
      device_(device),
      rank_(rank),
      origin_(std::chrono::steady_clock::now()),
      fwd_(graph.nodes().size(), 0.0),
      bwd_(graph.nodes().size(), 0.0) {
  for (const graph::Node& n : graph.nodes()) {
    const NodeWork w = node_work(graph, n);
    node_flops_.push_back(w.flops);
    node_bytes_.push_back(w.bytes);
  }
  events_.push_back({{"ph", "M"},
                     {"name", "process_name"},
                     {"pid", rank_},
                     {"args", {{"name", fmt::format("rank {} ({})", rank_, device_.str())}}}});
  name_track(kMainTrack, "training");
}

void Profiler::attach(graph::Executor& ex) {
  DTRAIN_CHECK(ex_ == nullptr, "Profiler::attach twice");
  ex_ = &ex;
  saved_ = ex.hooks;
  const graph::BackwardSet frozen = ex.backward_set();  // what backward skips (the roofline's)
  bwd_passes_.clear();
  for (size_t i = 0; i < graph_.nodes().size(); ++i)
    bwd_passes_.push_back(backward_passes(graph_, frozen, static_cast<int>(i)));
  ex.hooks.pre_op = [this, before = saved_.pre_op](int node, graph::Phase phase) {
    if (before) before(node, phase);  // ZeRO-3's gathers stay outside the op's span
    op_begin(node, phase);
  };
  ex.hooks.post_op = [this, after = saved_.post_op](int node, graph::Phase phase) {
    op_end(node, phase);
    if (after) after(node, phase);
  };
}

void Profiler::detach() {
  if (!ex_) return;
  ex_->hooks = saved_;
  ex_ = nullptr;
}

double Profiler::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
}

double Profiler::from_steady(double steady_seconds) const {
  return steady_seconds - std::chrono::duration<double>(origin_.time_since_epoch()).count();
}

void Profiler::op_begin(int node, graph::Phase phase) {
  kernels::synchronize(device_);  // the work before is done (a no-op on the CPU)
  if (tracing_ && device_.is_cuda()) {
    kernels::trace_range_push(graph_.nodes()[static_cast<size_t>(node)].name + " " +
                              phase_name(phase));
  }
  op_start_ = now();
}

void Profiler::op_end(int node, graph::Phase phase) {
  kernels::synchronize(device_);
  const double end = now();
  const auto i = static_cast<size_t>(node);
  (phase == graph::Phase::backward ? bwd_ : fwd_)[i] += end - op_start_;
  if (!tracing_) return;
  if (device_.is_cuda()) kernels::trace_range_pop();
  const graph::Node& n = graph_.nodes()[i];
  const double k = phase == graph::Phase::backward ? bwd_passes_[i] : 1.0;  // the roofline's
  span(n.name, phase_name(phase), kMainTrack, op_start_, end,
       {{"op", std::string(n.op->kind())},
        {"flops", k * node_flops_[i]},
        {"bytes", k * node_bytes_[i]},
        {"node", node}});
  // What the allocators hand out after each op: activations grow through forward and
  // shrink through backward.
  nlohmann::json mem = {{"host_bytes", host_allocator().stats().current}};
  if (device_.is_cuda()) mem["device_bytes"] = kernels::device_allocator(device_).stats().current;
  counter("memory", std::move(mem));
}

void Profiler::span(const std::string& name, const std::string& category, int track, double start,
                    double end, nlohmann::json args) {
  events_.push_back({{"ph", "X"},
                     {"name", name},
                     {"cat", category},
                     {"pid", rank_},
                     {"tid", track},
                     {"ts", start * 1e6},
                     {"dur", (end - start) * 1e6},
                     {"args", std::move(args)}});
}

void Profiler::counter(const std::string& name, nlohmann::json values) {
  events_.push_back({{"ph", "C"},
                     {"name", name},
                     {"pid", rank_},
                     {"tid", kMainTrack},
                     {"ts", now() * 1e6},
                     {"args", std::move(values)}});
}

void Profiler::name_track(int track, const std::string& name) {
  if (!named_.insert(track).second) return;  // named once
  events_.push_back({{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", rank_},
                     {"tid", track},
                     {"args", {{"name", name}}}});
}

Profiler::Scope::Scope(Profiler* p, std::string name, std::string category, nlohmann::json args)
    : p_(p && p->tracing_ && p->attached() ? p : nullptr),
      name_(std::move(name)),
      category_(std::move(category)),
      args_(std::move(args)) {
  if (!p_) return;
  if (p_->device_.is_cuda()) kernels::trace_range_push(name_);
  start_ = p_->now();
}

Profiler::Scope::~Scope() {
  if (!p_) return;
  if (p_->device_.is_cuda()) kernels::trace_range_pop();
  p_->span(name_, category_, kMainTrack, start_, p_->now(),
           args_.is_null() ? nlohmann::json::object() : std::move(args_));
}

void Profiler::write(const std::filesystem::path& file) const {
  const nlohmann::json trace = {{"traceEvents", events_},
                                {"displayTimeUnit", "ms"},
                                {"otherData", {{"producer", "dtrain"}, {"rank", rank_}}}};
  write_file_atomic(file.string(), {trace.dump()});
}

ProfileWindow::ProfileWindow(const ProfileOptions& o, const graph::Graph& graph, Device device,
                             int rank, std::filesystem::path file)
    : o_(o), graph_(graph), device_(device), rank_(rank), file_(std::move(file)) {}

bool ProfileWindow::covers(int64_t step) const {
  const int64_t first = std::max<int64_t>(o_.start, 1);
  return o_.steps > 0 && step >= first && step < first + o_.steps;
}

void ProfileWindow::before(int64_t step, graph::Executor& ex, dist::TracedBuckets* sync) {
  if (!covers(step)) return;
  if (!profiler_) {
    first_ = step;
    profiler_ = std::make_unique<Profiler>(graph_, device_, rank_);
    if (sync) {
      for (size_t b = 0; b < sync->buckets().size(); ++b)
        profiler_->name_track(Profiler::kBucketTrack0 + static_cast<int>(b),
                              fmt::format("bucket {}", b));
      sync->set_trace([this, sync](size_t b, double start, double seconds, uint64_t bytes) {
        const double t0 = profiler_->from_steady(start);
        profiler_->span(fmt::format("bucket {}", b), "comm",
                        Profiler::kBucketTrack0 + static_cast<int>(b), t0, t0 + seconds,
                        {{"bytes", bytes}, {"exchange", sync->exchange(b)}});
      });
    }
  }
  if (!profiler_->attached()) profiler_->attach(ex);
}

std::string ProfileWindow::after(int64_t step, bool last, dist::TracedBuckets* sync) {
  if (!profiler_ || !profiler_->attached()) return {};
  if (covers(step + 1) && !last) return {};
  profiler_->detach();
  if (sync) sync->set_trace(nullptr);
  // A run resumed inside the window traces the rest of it; the file of the steps before
  // the stop stays as it is, beside this one.
  const int64_t window = std::max<int64_t>(o_.start, 1);
  std::filesystem::path file = file_;
  std::string rest;
  if (first_ > window) {
    file.replace_filename(fmt::format("{}-from-step-{}.json", file_.stem().string(), first_));
    rest = fmt::format(
        "; the run resumed inside logging.profile's steps {}-{}, whose earlier "
        "steps stay in {}",
        window, window + o_.steps - 1, file_.string());
  }
  profiler_->write(file);
  return fmt::format("profile: steps {}-{} written to {} ({} events; open in Perfetto){}", first_,
                     step, file.string(), profiler_->events(), rest);
}

}  // namespace dtrain::runtime
