// Pipeline parallelism, one stage's side (parallel.pipeline): this rank runs the nodes
// of its stage (graph/stages.h) for every micro-batch of a step, receiving activations
// from the stage before and gradients from the stage after over the pipeline group's
// point-to-point exchanges (Communicator::exchange: a send and a receive posted
// together, so neighbours never wait on each other), in the order of a schedule:
//  - gpipe: every micro-batch forward, then every backward (m micro-batches alive);
//  - 1f1b: P - s - 1 forwards to fill the pipe, then one forward and one backward in
//    turn, then the remaining backwards (at most P - s alive on stage s).
// Backward runs in micro-batch order on every stage, so the gradients add up in the
// order one rank accumulating the same micro-batches adds them: the result is the
// one-rank run's, bit for bit. The executor holds one slot per micro-batch in flight.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"
#include "dist/options.h"
#include "graph/executor.h"
#include "graph/stages.h"

namespace dtrain::runtime {

// The job's stages: parallel.pipeline_blocks by hand, else balanced by FLOPs.
std::vector<graph::Stage> job_stages(const ParallelOptions& parallel, const graph::Graph& graph);

// Each stage's span of the fp32 parameter layout (`layout`, `total` elements with its
// padding): what the stage's optimizer steps and its checkpoint shard holds. A
// parameter is the stage's of its first user (FlatEntry::node); the graph adds them in
// node order, so the spans are contiguous and tile [0, total) in stage order (a stage
// without parameters of its own has an empty span). A weight tied to a later stage is
// in the earlier stage's span.
std::vector<std::pair<int64_t, int64_t>> stage_spans(const std::vector<graph::FlatEntry>& layout,
                                                     const std::vector<graph::Stage>& stages,
                                                     int64_t total);

// Weights tied across a cut (GPT-2's embedding and LM head, BERT's masked-LM decoder):
// both stages hold the weight, each computes its users' part of the gradient, and the
// two parts are summed into the earlier stage after each step's backward. That stage owns
// the weight (it is in that stage's span): its optimizer steps it, the gradient's norm
// counts it there, and after each step it sends the updated weight, as the model holds
// it, to the later stage (publish). A weight used by more than two stages, or two pairs
// of stages, is an Error naming parallel.pipeline.
class TiedWeights {
 public:
  TiedWeights(const graph::Graph& graph, const std::vector<graph::Stage>& stages);
  bool empty() const { return tied_.empty(); }
  // Collective over the pipeline group: the two stages' own group (watched by the caller).
  void connect(dist::Communicator& pipe);
  dist::Communicator* comm() const { return comm_.get(); }  // null off the two stages
  // `grads` in `layout` (f32): the tied weights' parts summed into the earlier stage's
  // (the later stage's copy is left as it was: nothing there reads it).
  void sum(const Tensor& grads, const std::vector<graph::FlatEntry>& layout);
  // After the earlier stage's step: its parameters of the tied weights (the executor's,
  // in their compute dtype) into the later stage's copies.
  void publish(graph::FlatStore& params);

 private:
  std::vector<int> tied_;
  std::pair<int, int> pair_{-1, -1};
  std::unique_ptr<dist::Communicator> comm_;
};

// Each stage's range of every flat f32 tensor in `flats` (each with its layout: a
// stage's entries are a contiguous range, the graph adding them in node order) travels
// to stage 0, into its copies (which its own nodes never use): collective over `pipe`.
// A pipeline checkpoint is written by shard (each stage its span); stage 0 first
// gathers the buffers (batch norm's statistics), which its shard carries. Each stage's
// range is its span of the flat tensor (stage_spans).
void gather_to_first_stage(
    dist::Communicator& pipe, const std::vector<graph::Stage>& stages,
    const std::vector<std::pair<Tensor, const std::vector<graph::FlatEntry>*>>& flats);

class PipelineStage {
 public:
  // `pipe`: the pipeline group (rank s = stage s). Sets the executor's range and slots.
  PipelineStage(const graph::Graph& graph, graph::Executor& ex, std::vector<graph::Stage> stages,
                dist::Communicator& pipe, PipelineSchedule schedule, int micro_batches);

  int stage() const { return stage_; }
  int stages() const { return static_cast<int>(stages_.size()); }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == stages(); }
  const std::vector<graph::Stage>& plan() const { return stages_; }
  PipelineSchedule schedule() const { return schedule_; }

  // What a step asks of the trainer per micro-batch m: before its forward, set the graph
  // inputs and return the batch key; after it (buffers); d loss for its backward (the
  // last stage's); before and after its backward (in micro-batch order), arm the
  // gradient sync and accumulate.
  struct StepHooks {
    std::function<graph::BatchKey(int m)> feed;
    std::function<void(int m)> after_forward;
    std::function<float(int m)> dloss;
    std::function<void(int m)> before_backward;
    std::function<void(int m)> after_backward;
  };
  void train_step(uint64_t step, graph::ValueId loss, const StepHooks& hooks);
  // One evaluation batch in slot 0: `feed` sets its inputs; receive, forward, send.
  void eval_forward(uint64_t step, const std::function<void()>& feed);

  // The most micro-batches this stage held at once (GPipe: all of them; 1F1B: at most
  // the stages from here to the last).
  int max_in_flight() const { return max_in_flight_; }
  // Bytes of activations and gradients this rank sent and received (every step so far).
  uint64_t bytes_moved() const { return bytes_; }
  // Seconds this rank spent in exchanges with its neighbours (waiting included).
  double exchange_seconds() const { return exchange_seconds_; }

  // The profiler's view: each micro-batch's forward and backward on this stage ("forward
  // 3") and each exchange ("send act 3, recv grad 1"), as (name, category "pipeline" or
  // "exchange", start in steady_clock seconds, seconds, bytes); null: nothing recorded.
  using TraceFn = std::function<void(const std::string& name, const std::string& category,
                                     double start, double seconds, uint64_t bytes)>;
  void set_trace(TraceFn trace) { trace_ = std::move(trace); }

 private:
  void forward(int m, uint64_t step, const StepHooks& hooks, graph::Mode mode);
  void backward(int m, graph::ValueId loss, const StepHooks& hooks);
  // The exchanges: the activations of micro-batch `send_fwd` to the next stage, the
  // gradients of `send_bwd` to the one before; receiving `recv_fwd`'s activations and
  // `recv_bwd`'s gradients (-1: none), all in one exchange.
  void exchange(int send_fwd, int recv_fwd, int send_bwd, int recv_bwd);

  const graph::Graph& graph_;
  graph::Executor& ex_;
  std::vector<graph::Stage> stages_;
  dist::Communicator& pipe_;
  PipelineSchedule schedule_;
  int micro_ = 1, stage_ = 0;
  // What travels back: the received values that take a gradient, of this stage and the
  // next (what this stage sends back and what it gets back).
  std::vector<graph::ValueId> grads_out_, grads_in_;
  // Per micro-batch slot: what the next stage sent back, what this stage sends back.
  std::vector<std::vector<Tensor>> got_act_, got_grad_, out_grad_;
  std::vector<char> alive_;
  int max_in_flight_ = 0;
  uint64_t bytes_ = 0;
  double exchange_seconds_ = 0;
  TraceFn trace_;
};

}  // namespace dtrain::runtime
