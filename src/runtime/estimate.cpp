// See estimate.h. Mirrors what TrainSession allocates (trainer.cpp, master_weights.cpp,
// the optimizers, data_feed.cpp); tests/train/test_estimate.cpp holds it to the
// allocator's measured peak.
#include "runtime/estimate.h"

#include <algorithm>

#include "core/allocator.h"
#include "models/registry.h"
#include "precision/options.h"

namespace dtrain::runtime {
namespace {

std::string human(size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} kB", b / 1e3);
}

std::string where(const graph::Graph& g, const graph::ActivationPeak& p) {
  if (p.node == -2) return "the accuracy count (half logits widened to f32)";
  if (p.node < 0) return "nowhere";
  return fmt::format("{} of {}", p.phase == graph::Phase::forward ? "forward" : "backward",
                     g.nodes()[static_cast<size_t>(p.node)].name);
}

}  // namespace

MemoryEstimate estimate_memory(const Job& job) {
  // The host's caching allocator rounds to its size classes; on a GPU we round to the
  // same classes (the device pool's blocks are at least as coarse).
  const graph::RoundBytes round = [](size_t b) { return CachingAllocator::size_class(b); };
  const int64_t batch = job.data.micro_batch;
  graph::DTypePolicy policy;
  policy.compute = compute_dtype(job.precision.dtype);
  const models::ModelGraph m = models::build_model(job.model, batch, policy);
  const graph::Graph& g = m.graph;
  MemoryEstimate e;
  auto add = [&](std::string kind, size_t bytes, std::string note) {
    if (bytes > 0) e.state.push_back({std::move(kind), bytes, std::move(note)});
  };
  const graph::ExecutorBytes ex = graph::executor_bytes(g, job.device, round);
  add("parameters", ex.params,
      policy.half() ? fmt::format("{} (normalisation parameters f32)", dtype_name(policy.compute))
                    : "f32");
  add("gradients", ex.grads, "f32, every precision");
  add("buffers", ex.buffers, "batch-norm running statistics");
  add("workspace", ex.workspace, "shared by the ops, the largest one's");
  const size_t f32_layout = ex.grads;  // the fp32 layout: masters and optimizer state alike
  if (policy.half() && job.precision.master_weights)
    add("master weights", f32_layout, "fp32 copy the optimizer steps");
  const OptimizerOptions& o = job.optimizer;
  const int states = o.name == OptimizerName::sgd ? (o.momentum > 0 ? 1 : 0) : 2;
  add("optimizer state", f32_layout * static_cast<size_t>(states),
      o.name == OptimizerName::sgd ? "momentum" : "exp_avg, exp_avg_sq");
  if (job.parallel.micro_batches > 1)
    add("gradient accumulation", f32_layout, "f32, over micro-batches");
  // Data: what the feed holds. Images: the loader's slots (prefetch + 1 with workers),
  // each a batch of f32 images and i32 labels, and the feed's label copy. Tokens: the
  // batch in use and the next one, each ids and labels i32 [batch, seq].
  const graph::TensorSpec& in = g.value(m.input).spec;
  const size_t in_bytes = static_cast<size_t>(in.shape.numel()) * dtype_size(in.dtype);
  const size_t label_bytes = static_cast<size_t>(g.value(m.labels).spec.shape.numel()) * 4;
  const bool images = in.dtype != DType::i32;
  const int slots = job.data.workers == 0 ? 1 : job.data.prefetch + 1;
  const size_t data = images ? static_cast<size_t>(slots) * (round(in_bytes) + round(label_bytes)) +
                                   round(label_bytes)
                             : 2 * (round(in_bytes) + round(label_bytes));
  add("data", data,
      images ? fmt::format("{} loader slot(s) of {} samples", slots, batch)
             : fmt::format("2 batches of {} windows", batch));
  for (const MemoryItem& i : e.state) e.state_bytes += i.bytes;

  e.train = graph::plan_activations(g, graph::Mode::train, {}, round);
  std::vector<char> eval_pins(static_cast<size_t>(g.num_values()), 0);
  eval_pins[static_cast<size_t>(m.logits)] = 1;
  eval_pins[static_cast<size_t>(m.targets)] = 1;
  e.eval = graph::plan_activations(g, graph::Mode::eval, eval_pins, round);
  // After each evaluation forward the trainer reads the logits on the host as f32
  // (TrainSession::evaluate): half logits are widened into a copy then.
  const graph::TensorSpec& logits = g.value(m.logits).spec;
  if (logits.dtype != DType::f32) {
    const size_t wide = e.eval.at_end + round(static_cast<size_t>(logits.shape.numel()) * 4);
    if (wide > e.eval.peak) {
      e.eval.peak = wide;
      e.eval.node = -2;  // after the forward
    }
  }
  e.train_peak_at = where(g, e.train);
  e.eval_peak_at = where(g, e.eval);
  const bool train_higher = e.train.peak >= e.eval.peak;
  e.peak_bytes = e.state_bytes + std::max(e.train.peak, e.eval.peak);
  e.peak_at = train_higher ? e.train_peak_at : e.eval_peak_at + " (evaluation)";
  e.step_flops = 3.0 * g.forward_flops() * static_cast<double>(job.parallel.micro_batches);
  return e;
}

std::string format_estimate(const MemoryEstimate& e) {
  std::string out = "memory per rank (estimate)\n";
  for (const MemoryItem& i : e.state)
    out += fmt::format("  {:<22} {:>10}  {}\n", i.kind, human(i.bytes), i.note);
  out += fmt::format("  {:<22} {:>10}\n", "state total", human(e.state_bytes));
  out += fmt::format("  {:<22} {:>10}  at {}\n", "activations (train)", human(e.train.peak),
                     e.train_peak_at);
  out += fmt::format("  {:<22} {:>10}  at {}\n", "activations (eval)", human(e.eval.peak),
                     e.eval_peak_at);
  out += fmt::format("  {:<22} {:>10}  at {}\n", "peak", human(e.peak_bytes), e.peak_at);
  out += fmt::format("compute: {:.3g} FLOPs per step (forward + backward, every micro-batch)\n",
                     e.step_flops);
  return out;
}

}  // namespace dtrain::runtime
