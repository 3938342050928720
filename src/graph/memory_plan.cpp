// See memory_plan.h. Mirrors Executor::forward / backward / backward_node step for
// step; a change there that allocates differently must change here (the estimate
// test, tests/train/test_estimate.cpp, compares this with the allocator's peak).
#include "graph/memory_plan.h"

#include <algorithm>
#include <memory>

#include "graph/lifetimes.h"

namespace dtrain::graph {
namespace {

size_t bytes_of(const TensorSpec& s) {
  return static_cast<size_t>(s.shape.numel()) * dtype_size(s.dtype);
}

class Tally {
 public:
  explicit Tally(const RoundBytes& round) : round_(round) {}
  size_t add(size_t bytes) {
    const size_t b = bytes == 0 ? 0 : round_(bytes);
    current_ += b;
    return b;
  }
  void remove(size_t rounded) { current_ -= rounded; }
  void hold(size_t rounded) { current_ += rounded; }  // rounded already
  // Made and freed at `node` (rounded already): it counts in the high-water mark only.
  void spike(size_t rounded, int node, Phase phase) {
    current_ += rounded;
    mark(node, phase);
    current_ -= rounded;
  }
  // Records the high-water mark, and where it happened.
  void mark(int node, Phase phase) {
    if (current_ > peak_.peak) {
      peak_.peak = current_;
      peak_.node = node;
      peak_.phase = phase;
    }
  }
  size_t current() const { return current_; }
  ActivationPeak peak() const { return peak_; }

 private:
  const RoundBytes& round_;
  size_t current_ = 0;
  ActivationPeak peak_;
};

}  // namespace

ActivationPeak plan_activations(const Graph& graph, Mode mode, const std::vector<char>& pinned,
                                const RoundBytes& round, int blocks_per_segment,
                                const GradBuckets* buckets, const ParamGathers* gathers,
                                const StageRange* stage, const std::vector<int>& cuts,
                                const BackwardSet* frozen) {
  const auto& nodes = graph.nodes();
  const int n = static_cast<int>(nodes.size());
  DTRAIN_CHECK(stage == nullptr || gathers == nullptr,
               "a pipeline stage's plan with ZeRO-3's gathers");
  const int lo = stage != nullptr ? stage->begin : 0;
  const int hi = stage != nullptr ? stage->end : n;
  const Lifetimes life = plan_lifetimes(graph, mode, pinned, blocks_per_segment, cuts, frozen);
  const BackwardSet none;
  const BackwardSet& set = frozen != nullptr ? *frozen : none;
  Tally t(round);
  std::vector<size_t> value(static_cast<size_t>(graph.num_values()), 0);  // rounded bytes held
  std::vector<size_t> saved(nodes.size(), 0);
  auto release = [&](int step) {
    for (ValueId v : life.release_after[static_cast<size_t>(step)]) {
      t.remove(value[static_cast<size_t>(v)]);
      value[static_cast<size_t>(v)] = 0;
    }
  };
  // ZeRO-3's gathered units, as ShardedParams::before / end_pass hold them.
  std::unique_ptr<GatherSchedule> schedule;
  std::vector<size_t> unit_held;  // rounded bytes per unit, 0 when not held
  double gathered = 0;            // ActivationPeak::gathered_bytes
  if (gathers != nullptr) {
    schedule = std::make_unique<GatherSchedule>(*gathers->units);
    unit_held.assign(gathers->units->units().size(), 0);
  }
  auto gather = [&](int node, Phase phase) {
    if (!schedule) return;
    const GatherActions a = schedule->before(node, phase);
    for (int u : a.release) {
      t.remove(unit_held[static_cast<size_t>(u)]);
      unit_held[static_cast<size_t>(u)] = 0;
    }
    auto hold = [&](int u) {
      size_t& held = unit_held[static_cast<size_t>(u)];
      if (held > 0) return;
      const ParamUnit& pu = gathers->units->units()[static_cast<size_t>(u)];
      const size_t bytes = static_cast<size_t>(pu.hi - pu.lo) * dtype_size(gathers->dtype);
      held = t.add(bytes);
      gathered += static_cast<double>(bytes);
      for (int p : pu.wide) {
        const TensorSpec wide{gathers->f32_layout[static_cast<size_t>(p)].spec.shape, DType::f32};
        held += t.add(bytes_of(wide));
        gathered += static_cast<double>(wide.shape.numel()) * sizeof(float);
      }
    };
    for (int u : a.acquire) hold(u);
    for (int u : a.prefetch) hold(u);
  };
  auto end_pass = [&] {
    if (!schedule) return;
    for (int u : schedule->end_pass()) {
      t.remove(unit_held[static_cast<size_t>(u)]);
      unit_held[static_cast<size_t>(u)] = 0;
    }
  };
  if (stage != nullptr) {  // what the stage before sent, received before the forward
    for (ValueId v : stage->receives)
      value[static_cast<size_t>(v)] = t.add(bytes_of(graph.value(v).spec));
  }
  for (int i = lo; i < hi; ++i) {
    const Node& node = nodes[static_cast<size_t>(i)];
    gather(i, Phase::forward);
    for (size_t o = 0; o < node.outputs.size(); ++o)
      value[static_cast<size_t>(node.outputs[o])] = t.add(bytes_of(node.info.outputs[o]));
    for (const TensorSpec& s : node.info.saved) saved[static_cast<size_t>(i)] += t.add(bytes_of(s));
    t.mark(i, Phase::forward);
    if (mode != Mode::train || life.segment_of[static_cast<size_t>(i)] >= 0 || !set.runs(i)) {
      t.remove(saved[static_cast<size_t>(i)]);
      saved[static_cast<size_t>(i)] = 0;
    }
    release(i);
  }
  if (stage != nullptr) {  // Executor::release_unused: what no later step of the stage reads
    const std::vector<char> read = read_after_forward(graph, life, mode, lo, hi, frozen);
    for (size_t v = 0; v < value.size(); ++v) {
      if (value[v] == 0 || graph.value(static_cast<ValueId>(v)).producer < 0) continue;
      if (life.last_use[v] < 0 || read[v]) continue;
      t.remove(value[v]);
      value[v] = 0;
    }
    t.mark(hi - 1, Phase::forward);
  }
  const size_t after_forward = t.current();
  size_t exchange_after = 0;
  if (mode == Mode::train) {
    // Which values get a gradient: the loss (the last node's output), then every input
    // that requires one of a node reached by backward.
    std::vector<size_t> vgrad(value.size(), 0);
    std::vector<char> has_grad(value.size(), 0);
    const ValueId loss = nodes.back().outputs[0];
    if (hi == n) {
      has_grad[static_cast<size_t>(loss)] = 1;
      vgrad[static_cast<size_t>(loss)] = t.add(bytes_of(graph.value(loss).spec));
    }
    if (stage != nullptr) {  // the next stage's gradients, received before the backward
      for (ValueId v : stage->grad_seeds) {
        has_grad[static_cast<size_t>(v)] = 1;
        vgrad[static_cast<size_t>(v)] = t.add(bytes_of(graph.value(v).spec));
      }
    }
    // ZeRO-2's buckets: opened by the first gradient written into them (the param's
    // first user in backward), closed when every parameter's last user has run.
    std::vector<int> last_user(graph.param_layout().size(), -1);
    std::vector<int> bucket_pending;
    std::vector<char> bucket_open;
    ExchangeSequence exchanges;  // compress::Compressor's advance, start and complete
    if (buckets != nullptr) {
      bucket_pending.assign(buckets->bytes.size(), 0);
      bucket_open.assign(buckets->bytes.size(), 0);
      for (int i = lo; i < hi; ++i)  // a stage: its own nodes' parameters
        for (int p : nodes[static_cast<size_t>(i)].params)
          if (last_user[static_cast<size_t>(p)] < 0) last_user[static_cast<size_t>(p)] = i;
      for (size_t p = 0; p < last_user.size(); ++p)
        if (last_user[p] >= 0 && buckets->bucket_of[p] >= 0)
          ++bucket_pending[static_cast<size_t>(buckets->bucket_of[p])];
    }
    // half: 0 the f32 parameters' (grad_targets hands out their view before the op
    // runs), 1 the half ones' (widened into it after the op), -1 every one.
    auto open_buckets = [&](const Node& node, int half) {
      if (buckets == nullptr) return;
      for (size_t k = 0; k < node.params.size(); ++k) {
        const int p = node.params[k];
        // A half parameter whose op writes its f32 gradient itself counts as an f32 one.
        const DType dtype = graph.param_layout()[static_cast<size_t>(p)].spec.dtype;
        const bool is_half = dtype != DType::f32 && !half_grad_in_f32(*node.op, k, dtype) &&
                             !set.skips_grad(node, k);
        if ((half >= 0 && is_half != (half == 1)) || buckets->bucket_of[static_cast<size_t>(p)] < 0)
          continue;  // another's, or a stage's parameter in no bucket of its own
        const auto b = static_cast<size_t>(buckets->bucket_of[static_cast<size_t>(p)]);
        if (!bucket_open[b]) {
          t.add(buckets->bytes[b]);
          bucket_open[b] = 1;
        }
      }
    };
    auto close_buckets = [&](int i, const Node& node) {
      if (buckets == nullptr) return;
      for (int p : node.params) {
        if (last_user[static_cast<size_t>(p)] != i ||
            buckets->bucket_of[static_cast<size_t>(p)] < 0)
          continue;
        const auto b = static_cast<size_t>(buckets->bucket_of[static_cast<size_t>(p)]);
        if (--bucket_pending[b] == 0) {
          if (!buckets->exchange.empty()) {
            const size_t before = exchanges.held();
            const size_t most = exchanges.ready(buckets->exchange[b]);
            t.remove(before);
            t.spike(most, i, Phase::backward);
            t.hold(exchanges.held());
          }
          t.remove(buckets->bytes[b]);
          bucket_open[b] = 0;
        }
      }
    };
    for (int i = hi - 1; i >= lo; --i) {
      const Node& node = nodes[static_cast<size_t>(i)];
      const int seg = life.segment_of[static_cast<size_t>(i)];
      // Not a segment where no node runs backward (set_frozen).
      if (seg >= 0 && life.segments[static_cast<size_t>(seg)].last == i &&
          life.recomputed[static_cast<size_t>(seg)]) {
        for (int j = life.segments[static_cast<size_t>(seg)].first; j <= i; ++j) {
          const Node& r = nodes[static_cast<size_t>(j)];
          gather(j, Phase::recompute);
          for (size_t o = 0; o < r.outputs.size(); ++o) {
            size_t& held = value[static_cast<size_t>(r.outputs[o])];
            if (held == 0) held = t.add(bytes_of(r.info.outputs[o]));
          }
          for (const TensorSpec& sp : r.info.saved)
            saved[static_cast<size_t>(j)] += t.add(bytes_of(sp));
          size_t temps = 0;
          for (const TensorSpec& sp : r.info.recompute_temps) temps += t.add(bytes_of(sp));
          t.mark(j, Phase::backward);
          t.remove(temps);
          for (ValueId v : life.recompute_release[static_cast<size_t>(j)]) {
            t.remove(value[static_cast<size_t>(v)]);
            value[static_cast<size_t>(v)] = 0;
          }
        }
      }
      bool reached = false;
      for (ValueId v : node.outputs) reached = reached || has_grad[static_cast<size_t>(v)];
      reached = reached && set.runs(i);      // set_frozen's skipped node: as if unreached
      open_buckets(node, reached ? 0 : -1);  // grad_targets, or an unreached node's zeros
      if (!reached && buckets != nullptr) t.mark(i, Phase::backward);
      if (reached) {
        size_t transient = 0;
        // grad_targets: half parameters write into a temporary of their dtype; an f32
        // parameter's later user that cannot accumulate into a temporary too.
        for (size_t k = 0; k < node.params.size(); ++k) {
          const FlatEntry& e = graph.param_layout()[static_cast<size_t>(node.params[k])];
          const bool later = [&] {
            for (int j = i + 1; j < hi; ++j) {
              const auto& ps = nodes[static_cast<size_t>(j)].params;
              if (std::find(ps.begin(), ps.end(), node.params[k]) != ps.end()) return true;
            }
            return false;
          }();
          if (set.skips_grad(node, k)) {
            // frozen: no gradient computed (its first user zeroes the f32 one)
          } else if (set.scratch_grad(node.params[k])) {  // computed, dropped
            const bool f32 = half_grad_in_f32(*node.op, k, e.spec.dtype);
            transient += t.add(bytes_of({e.spec.shape, f32 ? DType::f32 : e.spec.dtype}));
          } else if (half_grad_in_f32(*node.op, k, e.spec.dtype)) {
            // the op writes the f32 gradient itself (Op::param_grad_in_f32)
          } else if (e.spec.dtype != DType::f32) {
            transient += t.add(bytes_of({e.spec.shape, e.spec.dtype}));
          } else if (later && !(k < 32 && node.op->can_accumulate_param_grad(k))) {
            transient += t.add(bytes_of({e.spec.shape, DType::f32}));
          }
        }
        gather(i, Phase::backward);    // the pre_op hook, after grad_targets
        std::vector<size_t> zero_out;  // outputs the loss ignores get a zero gradient
        for (ValueId v : node.outputs) {
          const auto vi = static_cast<size_t>(v);
          if (!has_grad[vi] && graph.value(v).requires_grad) {
            vgrad[vi] = t.add(bytes_of(graph.value(v).spec));
            has_grad[vi] = 1;
          }
        }
        std::vector<size_t> din(node.inputs.size(), 0);
        std::vector<char> in_place(node.inputs.size(), 0);
        const int step = 2 * n - 1 - i;
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          const Value& in = graph.value(node.inputs[k]);
          if (!in.requires_grad || !set.wants(node.inputs[k])) continue;
          if (node.info.grad_in_place == static_cast<int>(k) &&
              grad_in_place_ok(graph, life, node.inputs[k], step) &&
              value[static_cast<size_t>(node.inputs[k])] > 0) {
            in_place[k] = 1;  // written over the input, which dies at this step
            continue;
          }
          din[k] = t.add(bytes_of(in.spec));
        }
        size_t op_temps = 0;
        for (const TensorSpec& s : node.info.backward_temps) op_temps += t.add(bytes_of(s));
        if (node.info.writes_input_grad &&
            (!graph.value(node.inputs[0]).requires_grad || !set.wants(node.inputs[0])))
          op_temps += t.add(bytes_of(graph.value(node.inputs[0]).spec));
        t.mark(i, Phase::backward);
        t.remove(op_temps);
        if (buckets != nullptr) {  // the half gradients' buckets, while din and gp are held
          open_buckets(node, 1);
          t.mark(i, Phase::backward);
        }
        // Half weight gradients of a later user are widened through an f32 temporary.
        for (size_t k = 0; k < node.params.size(); ++k) {
          const FlatEntry& e = graph.param_layout()[static_cast<size_t>(node.params[k])];
          bool first = true;
          for (int j = i + 1; j < hi && first; ++j) {
            const auto& ps = nodes[static_cast<size_t>(j)].params;
            first = std::find(ps.begin(), ps.end(), node.params[k]) == ps.end();
          }
          if (e.spec.dtype != DType::f32 && !first &&
              !half_grad_in_f32(*node.op, k, e.spec.dtype) && !set.skips_grad(node, k) &&
              !set.scratch_grad(node.params[k])) {
            const size_t wide = t.add(bytes_of({e.spec.shape, DType::f32}));
            t.mark(i, Phase::backward);
            t.remove(wide);
          }
        }
        t.remove(transient);
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          const auto vi = static_cast<size_t>(node.inputs[k]);
          if (in_place[k] && !has_grad[vi]) {  // the value's memory becomes its gradient
            vgrad[vi] = value[vi];
            value[vi] = 0;
            has_grad[vi] = 1;
            continue;
          }
          if (din[k] == 0) continue;
          if (has_grad[vi]) {
            t.remove(din[k]);  // added into the gradient already there
          } else {
            vgrad[vi] = din[k];
            has_grad[vi] = 1;
          }
        }
      }
      for (ValueId v : node.outputs) {
        t.remove(vgrad[static_cast<size_t>(v)]);
        vgrad[static_cast<size_t>(v)] = 0;
      }
      t.remove(saved[static_cast<size_t>(i)]);
      saved[static_cast<size_t>(i)] = 0;
      release(2 * n - 1 - i);
      close_buckets(i, node);  // grad_ready: reduced into the shard, freed
    }
    // Completed after backward (dist::GradSync::finish).
    t.remove(exchanges.held());
    exchange_after = exchanges.finish();
  }
  end_pass();  // after backward, or after an evaluation's forward
  ActivationPeak p = t.peak();
  p.at_end = t.current();
  p.exchange_after = exchange_after;
  p.gathered_bytes = gathered;
  if (stage != nullptr) p.held_after_forward = after_forward;
  return p;
}

size_t ExchangeSequence::advance() {
  size_t most = 0;
  if (second_ != nullptr) {  // completes beside the one started after it
    most = (first_ != nullptr ? first_->held : 0) + second_->complete;
    second_ = nullptr;
  }
  if (first_ != nullptr) {
    most = std::max(most, first_->advance);
    if (first_->complete > 0) second_ = first_;  // two collectives: completes later
    first_ = nullptr;
  }
  return most;
}

size_t ExchangeSequence::ready(const BucketExchange& e) {
  const size_t most = advance();
  const size_t started = held() + e.start;
  first_ = &e;
  return std::max(most, started);
}

size_t ExchangeSequence::finish() {
  const size_t most = advance();
  return std::max(most, advance());
}

size_t ExchangeSequence::held() const {
  return (first_ != nullptr ? first_->held : 0) + (second_ != nullptr ? second_->held2 : 0);
}

ExecutorBytes executor_bytes(const Graph& graph, Device device, const RoundBytes& round) {
  auto store = [&](const std::vector<FlatEntry>& entries) {
    const FlatStore layout(entries);
    size_t total = 0;
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const int64_t elems = layout.buffer_elems(dt);
      if (elems > 0) total += round(static_cast<size_t>(elems) * dtype_size(dt));
    }
    return total;
  };
  ExecutorBytes b;
  b.params = store(graph.param_layout());
  std::vector<FlatEntry> grads = graph.param_layout();
  for (FlatEntry& e : grads) e.spec.dtype = DType::f32;
  b.grads = store(grads);
  b.buffers = store(graph.buffer_layout());
  const size_t ws = graph.max_workspace_bytes(device);
  b.workspace = ws > 0 ? round(ws) : 0;
  return b;
}

}  // namespace dtrain::graph
