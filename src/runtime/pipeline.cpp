// See pipeline.h.
#include "runtime/pipeline.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::runtime {

std::vector<graph::Stage> job_stages(const ParallelOptions& parallel, const graph::Graph& graph) {
  if (parallel.pipeline_blocks) return graph::stages_from_blocks(graph, *parallel.pipeline_blocks);
  return graph::plan_stages(graph, parallel.pipeline);
}

TiedWeights::TiedWeights(const graph::Graph& graph, const std::vector<graph::Stage>& stages)
    : tied_(graph::params_across_stages(graph, stages)) {
  for (int p : tied_) {
    std::vector<int> users;
    for (size_t k = 0; k < stages.size(); ++k)
      for (int i = stages[k].begin; i < stages[k].end; ++i)
        for (int q : graph.nodes()[static_cast<size_t>(i)].params)
          if (q == p && (users.empty() || users.back() != static_cast<int>(k)))
            users.push_back(static_cast<int>(k));
    const std::pair<int, int> pair{users.front(), users.back()};
    if (users.size() != 2 || (pair_.first >= 0 && pair != pair_)) {
      throw Error(
          fmt::format("parallel.pipeline: {} is used by stages {}; a weight tied across "
                      "more than two stages (or two pairs of them) is not supported yet",
                      graph.param_layout()[static_cast<size_t>(p)].name, fmt::join(users, ", ")),
          "use fewer pipeline stages");
    }
    pair_ = pair;
  }
}

void TiedWeights::connect(dist::Communicator& pipe) {
  if (tied_.empty()) return;
  const bool member = pipe.rank() == pair_.first || pipe.rank() == pair_.second;
  comm_ = pipe.split(member ? 0 : 1, pipe.rank());
  if (!member) comm_.reset();
}

void TiedWeights::sum(const Tensor& grads, const std::vector<graph::FlatEntry>& layout) {
  if (!comm_) return;
  for (int p : tied_) {  // into the earlier stage (rank 0 of the pair), which steps it
    const graph::FlatEntry& e = layout[static_cast<size_t>(p)];
    comm_->reduce(grads.view(e.offset, Shape{e.spec.shape.numel()}), 0);
  }
}

void TiedWeights::publish(graph::FlatStore& params) {
  if (!comm_) return;
  // Rank 0 of the pair is the earlier stage. Point to point: half parameters travel as
  // they are (the exchange moves any dtype).
  std::vector<dist::Communicator::PeerOp> ops;
  const bool sends = comm_->rank() == 0;
  for (int p : tied_) ops.push_back({sends, sends ? 1 : 0, params.view(p)});
  comm_->exchange(ops);
}

std::vector<std::pair<int64_t, int64_t>> stage_spans(const std::vector<graph::FlatEntry>& layout,
                                                     const std::vector<graph::Stage>& stages,
                                                     int64_t total) {
  const auto stage_of = [&](int node) {
    size_t s = 0;
    while (s + 1 < stages.size() && node >= stages[s].end) ++s;
    return static_cast<int>(s);
  };
  std::vector<int64_t> start(stages.size() + 1, -1);
  start[stages.size()] = total;
  int last = 0;
  int64_t at = 0;
  for (const graph::FlatEntry& e : layout) {
    const int s = stage_of(e.node);
    DTRAIN_CHECK(s >= last && e.offset >= at, "{} (stage {}) after stage {}'s parameters", e.name,
                 s, last);
    if (start[static_cast<size_t>(s)] < 0) start[static_cast<size_t>(s)] = e.offset;
    last = s;
    at = e.offset;
  }
  start[0] = 0;
  for (size_t s = stages.size(); s-- > 1;)  // a stage without parameters: an empty span
    if (start[s] < 0) start[s] = start[s + 1];
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (size_t s = 0; s < stages.size(); ++s) spans.emplace_back(start[s], start[s + 1]);
  return spans;
}

void gather_to_first_stage(
    dist::Communicator& pipe, const std::vector<graph::Stage>& stages,
    const std::vector<std::pair<Tensor, const std::vector<graph::FlatEntry>*>>& flats) {
  std::vector<dist::Communicator::PeerOp> ops;
  for (const auto& [flat, entries] : flats) {
    if (!flat.defined()) continue;
    const auto spans = stage_spans(*entries, stages, flat.numel());
    for (int s = 1; s < pipe.size(); ++s) {
      if (pipe.rank() != 0 && pipe.rank() != s) continue;
      const auto [lo, hi] = spans[static_cast<size_t>(s)];
      if (lo == hi) continue;
      ops.push_back({pipe.rank() == s, pipe.rank() == 0 ? s : 0, flat.view(lo, Shape{hi - lo})});
    }
  }
  pipe.exchange(ops);
}

PipelineStage::PipelineStage(const graph::Graph& graph, graph::Executor& ex,
                             std::vector<graph::Stage> stages, dist::Communicator& pipe,
                             PipelineSchedule schedule, int micro_batches)
    : graph_(graph),
      ex_(ex),
      stages_(std::move(stages)),
      pipe_(pipe),
      schedule_(schedule),
      micro_(micro_batches),
      stage_(pipe.rank()) {
  DTRAIN_CHECK(static_cast<int>(stages_.size()) == pipe.size(), "{} stages for {} pipeline ranks",
               stages_.size(), pipe.size());
  const graph::Stage& mine = stages_[static_cast<size_t>(stage_)];
  ex_.set_range(mine.begin, mine.end);
  ex_.set_slots(micro_);
  got_act_.resize(static_cast<size_t>(micro_));
  got_grad_.resize(static_cast<size_t>(micro_));
  out_grad_.resize(static_cast<size_t>(micro_));
  alive_.assign(static_cast<size_t>(micro_), 0);
  const auto with_grad = [&](int s) {
    std::vector<graph::ValueId> out;
    for (graph::ValueId v : stages_[static_cast<size_t>(s)].receives)
      if (graph_.value(v).requires_grad) out.push_back(v);
    return out;
  };
  if (!first()) grads_out_ = with_grad(stage_);
  if (!last()) grads_in_ = with_grad(stage_ + 1);
}

void PipelineStage::exchange(int send_fwd, int recv_fwd, int send_bwd, int recv_bwd) {
  std::vector<dist::Communicator::PeerOp> ops;
  Allocator* alloc = &kernels::device_allocator(ex_.device());
  auto fresh = [&](graph::ValueId v) {
    const graph::TensorSpec& s = graph_.value(v).spec;
    return Tensor::empty(s.shape, s.dtype, alloc);
  };
  if (send_fwd >= 0 && !last()) {
    ex_.select_slot(send_fwd);
    for (graph::ValueId v : stages_[static_cast<size_t>(stage_) + 1].receives)
      ops.push_back({true, stage_ + 1, ex_.value(v)});
  }
  if (recv_fwd >= 0 && !first()) {
    std::vector<Tensor>& in = got_act_[static_cast<size_t>(recv_fwd)];
    in.clear();
    for (graph::ValueId v : stages_[static_cast<size_t>(stage_)].receives) {
      in.push_back(fresh(v));
      ops.push_back({false, stage_ - 1, in.back()});
    }
  }
  if (send_bwd >= 0 && !first()) {
    for (const Tensor& t : out_grad_[static_cast<size_t>(send_bwd)])
      ops.push_back({true, stage_ - 1, t});
  }
  if (recv_bwd >= 0 && !last()) {
    std::vector<Tensor>& in = got_grad_[static_cast<size_t>(recv_bwd)];
    in.clear();
    for (graph::ValueId v : grads_in_) {
      in.push_back(fresh(v));
      ops.push_back({false, stage_ + 1, in.back()});
    }
  }
  if (ops.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  pipe_.exchange(ops);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  exchange_seconds_ += secs;
  uint64_t moved = 0;
  for (const auto& o : ops) moved += o.buf.nbytes();
  bytes_ += moved;
  if (trace_) {
    std::string name;
    const auto part = [&](bool on, const char* what, int m) {
      if (on) name += fmt::format("{}{} {}", name.empty() ? "" : ", ", what, m);
    };
    part(send_fwd >= 0 && !last(), "send act", send_fwd);
    part(recv_fwd >= 0 && !first(), "recv act", recv_fwd);
    part(send_bwd >= 0 && !first(), "send grad", send_bwd);
    part(recv_bwd >= 0 && !last(), "recv grad", recv_bwd);
    trace_(name, "exchange", std::chrono::duration<double>(t0.time_since_epoch()).count(), secs,
           moved);
  }
  if (send_fwd >= 0 && !last()) {
    ex_.select_slot(send_fwd);
    ex_.release_unused();  // what only later stages read has gone
  }
  if (send_bwd >= 0) out_grad_[static_cast<size_t>(send_bwd)].clear();
}

void PipelineStage::forward(int m, uint64_t step, const StepHooks& hooks, graph::Mode mode) {
  ex_.select_slot(m);
  const graph::BatchKey key = hooks.feed(m);
  if (!first()) {
    const std::vector<graph::ValueId>& rx = stages_[static_cast<size_t>(stage_)].receives;
    std::vector<Tensor>& in = got_act_[static_cast<size_t>(m)];
    DTRAIN_CHECK(in.size() == rx.size(), "stage {}: micro-batch {} forward before its receive",
                 stage_, m);
    for (size_t k = 0; k < rx.size(); ++k) ex_.set_value(rx[k], std::move(in[k]));
    in.clear();
  }
  const auto t0 = std::chrono::steady_clock::now();
  ex_.forward(mode, step, key);
  if (trace_) {
    trace_(fmt::format("forward {}", m), "pipeline",
           std::chrono::duration<double>(t0.time_since_epoch()).count(),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0);
  }
  if (hooks.after_forward) hooks.after_forward(m);
  if (last()) ex_.release_unused();
  alive_[static_cast<size_t>(m)] = 1;
  max_in_flight_ =
      std::max(max_in_flight_, static_cast<int>(std::count(alive_.begin(), alive_.end(), 1)));
}

void PipelineStage::backward(int m, graph::ValueId loss, const StepHooks& hooks) {
  ex_.select_slot(m);
  std::vector<std::pair<graph::ValueId, Tensor>> seeds;
  if (!last()) {
    const std::vector<graph::ValueId>& vs = grads_in_;
    std::vector<Tensor>& in = got_grad_[static_cast<size_t>(m)];
    DTRAIN_CHECK(in.size() == vs.size(), "stage {}: micro-batch {} backward before its receive",
                 stage_, m);
    for (size_t k = 0; k < vs.size(); ++k) seeds.emplace_back(vs[k], std::move(in[k]));
    in.clear();
  }
  if (hooks.before_backward) hooks.before_backward(m);
  const auto t0 = std::chrono::steady_clock::now();
  ex_.backward(seeds, last() ? loss : -1, last() ? hooks.dloss(m) : 0.0f);
  if (trace_) {
    trace_(fmt::format("backward {}", m), "pipeline",
           std::chrono::duration<double>(t0.time_since_epoch()).count(),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0);
  }
  if (!first()) {
    std::vector<Tensor>& out = out_grad_[static_cast<size_t>(m)];
    out.clear();
    for (graph::ValueId v : grads_out_) {
      Tensor g = ex_.take_grad(v);
      if (!g.defined()) {  // no node of this stage reached it: a zero gradient
        const graph::TensorSpec& s = graph_.value(v).spec;
        g = Tensor::empty(s.shape, s.dtype, &kernels::device_allocator(ex_.device()));
        kernels::fill(g, 0.0f);
      }
      out.push_back(std::move(g));
    }
  }
  if (hooks.after_backward) hooks.after_backward(m);
  alive_[static_cast<size_t>(m)] = 0;
}

void PipelineStage::train_step(uint64_t step, graph::ValueId loss, const StepHooks& hooks) {
  const int m = micro_;
  const graph::Mode train = graph::Mode::train;
  if (schedule_ == PipelineSchedule::gpipe) {
    for (int i = 0; i < m; ++i) {
      exchange(-1, i, -1, -1);
      forward(i, step, hooks, train);
      exchange(i, -1, -1, -1);
    }
    for (int i = 0; i < m; ++i) {
      exchange(-1, -1, -1, i);
      backward(i, loss, hooks);
      exchange(-1, -1, i, -1);
    }
    return;
  }
  // 1F1B (PipeDream-Flush, as Megatron-LM schedules it): fill, steady state, drain.
  const int warm = std::min(stages() - stage_ - 1, m);
  const int steady = m - warm;
  for (int i = 0; i < warm; ++i) {
    exchange(-1, i, -1, -1);
    forward(i, step, hooks, train);
    exchange(i, -1, -1, -1);
  }
  if (steady > 0) exchange(-1, warm, -1, -1);
  for (int i = 0; i < steady; ++i) {
    const int f = warm + i;
    forward(f, step, hooks, train);
    exchange(f, -1, -1, i);  // this activation out, that gradient in: one exchange
    backward(i, loss, hooks);
    if (i + 1 == steady) {
      exchange(-1, -1, i, -1);
    } else {
      exchange(-1, f + 1, i, -1);
    }
  }
  for (int i = steady; i < m; ++i) {
    exchange(-1, -1, -1, i);
    backward(i, loss, hooks);
    exchange(-1, -1, i, -1);
  }
}

void PipelineStage::eval_forward(uint64_t step, const std::function<void()>& feed) {
  StepHooks hooks;
  hooks.feed = [&](int) {
    feed();
    return graph::BatchKey{};
  };
  exchange(-1, 0, -1, -1);
  forward(0, step, hooks, graph::Mode::eval);
  alive_[0] = 0;
  exchange(0, -1, -1, -1);
}

}  // namespace dtrain::runtime
