// The activation memory of one training step (or one evaluation) of a graph,
// replayed from the graph's specs by the executor's own rules, without allocating
// anything: what forward allocates (outputs, saved tensors), what lifetimes.h
// releases when, and what backward holds (the gradient frontier, input gradients,
// the parameter-gradient temporaries of half and tied parameters, the ops' declared
// backward temporaries). The executor's side of `dtrain estimate`; what lies outside
// a step (parameters, gradients, buffers, the workspace, optimizer state, data) is
// the caller's to add. Every allocation is rounded by `round` (the allocator's size
// class), so the sum is what the allocator reports.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "graph/executor.h"
#include "graph/graph.h"
#include "graph/lifetimes.h"
#include "graph/param_units.h"

namespace dtrain::graph {

struct ActivationPeak {
  size_t peak = 0;  // bytes held at the step's high-water mark
  int node = -1;    // the node running then
  Phase phase = Phase::forward;
  size_t at_end = 0;  // still held after the step (pinned values, the loss)
  // GradBuckets::exchange: the most the buckets still in flight when backward ends
  // hold while they complete after it (on top of at_end); 0: none.
  size_t exchange_after = 0;
  // A pipeline stage (StageRange): what one micro-batch holds from the end of its
  // forward (after Executor::release_unused) until its backward starts.
  size_t held_after_forward = 0;
  // ZeRO-3 (ParamGathers): the bytes the pass's all-gathers fill, each unit each time it
  // is gathered (unrounded); a rank receives (n - 1) / n of them.
  double gathered_bytes = 0;
};

// A pipeline stage's part of one micro-batch (graph/stages.h, Executor::set_range): its
// nodes, the values it receives (allocated as they arrive, before its forward), and
// the values whose gradient arrives from the next stage before its backward (the next
// stage's receives that take one). The loss seeds backward only on the stage holding it.
struct StageRange {
  int begin = 0, end = 0;
  std::vector<ValueId> receives;
  std::vector<ValueId> grad_seeds;
};

// The executor's persistent allocations: parameters, f32 parameter gradients,
// buffers and the shared workspace (one allocation per flat dtype buffer).
struct ExecutorBytes {
  size_t params = 0, grads = 0, buffers = 0, workspace = 0;
};

using RoundBytes = std::function<size_t(size_t)>;

// ZeRO-2 (dist/zero_grads.h): parameter gradients live in buckets, one allocation each,
// made when backward first writes one of the bucket's parameters and freed once its
// last parameter's gradient is ready; they count with the step's activations.
// `exchange`: what the bucket's exchange allocates (gradient compression's buffers,
// compress::exchange_bytes; empty: none): when its last gradient is ready, the bucket
// in its second collective completes (its `complete` bytes at most, then none), the one
// started before moves on (`advance` at most, then `held2` until the next bucket's ready,
// or none where it completed: `complete` 0) and its own starts (`start` at most, then
// `held`); what is in flight when backward ends completes after it
// (ActivationPeak::exchange_after). `bytes` may be 0 (the gradients live in the flat
// buffer).
struct BucketExchange {
  size_t start = 0, held = 0, advance = 0, held2 = 0, complete = 0;  // rounded
};
// The buckets' exchanges in flight, walked in the order compress::Compressor runs them
// (GradSync::launch and finish): the one walk behind the memory plan (overlap on) and
// the estimate's exchanges after backward (overlap off). Holds pointers to the
// exchanges it is given; they must outlive it.
class ExchangeSequence {
 public:
  // A bucket's last gradient is ready: the exchange in its second collective completes,
  // the one started last advances, `e` starts. Returns the most the exchanges hold at
  // once meanwhile; held() is what they hold after, until the next call.
  size_t ready(const BucketExchange& e);
  // Backward has ended: what is in flight completes. Returns the most held meanwhile;
  // held() is 0 after.
  size_t finish();
  size_t held() const;

 private:
  size_t advance();
  const BucketExchange* first_ = nullptr;   // started last: its `held`
  const BucketExchange* second_ = nullptr;  // advanced, not complete: its `held2`
};
struct GradBuckets {
  std::vector<int> bucket_of;            // per parameter; -1: in none (another pipeline stage's)
  std::vector<size_t> bytes;             // per bucket, rounded
  std::vector<BucketExchange> exchange;  // per bucket; empty: none
};

// ZeRO-3 (runtime/zero_params.h): each unit's gather buffer, one allocation of its
// range in the compute dtype, made and freed as graph::GatherSchedule says before each
// node (then released at the end of the pass), and one f32 allocation per wide
// parameter of the unit (ParamUnit::wide); counted with the step's activations.
struct ParamGathers {
  const ParamUnits* units = nullptr;
  DType dtype = DType::f32;
  std::vector<FlatEntry> f32_layout;  // for the units' wide parameters
};

// blocks_per_segment: activation checkpointing as Executor::set_checkpointing.
// stage: one micro-batch over a pipeline stage (cuts: the stages' first blocks, as
// Executor::set_checkpointing takes them; buckets: the stage's own, in a stage's plan
// its last micro-batch's backward); not with gathers.
// frozen: optimizer.freeze as Executor::set_frozen applies it (graph::backward_set,
// pruning only where that executor prunes); null: nothing frozen.
ActivationPeak plan_activations(const Graph& graph, Mode mode, const std::vector<char>& pinned,
                                const RoundBytes& round, int blocks_per_segment = 0,
                                const GradBuckets* buckets = nullptr,
                                const ParamGathers* gathers = nullptr,
                                const StageRange* stage = nullptr,
                                const std::vector<int>& cuts = {},
                                const BackwardSet* frozen = nullptr);
ExecutorBytes executor_bytes(const Graph& graph, Device device, const RoundBytes& round);

}  // namespace dtrain::graph
