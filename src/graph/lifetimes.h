// When each value of a static graph may be released: the one rule the executor
// follows and the memory planner (`dtrain estimate`) replays, so the two cannot
// diverge. A training step is 2N steps for N nodes: forward of node i is step i,
// backward of node i is step 2N - 1 - i; an evaluation is the N forward steps.
// A value lives from its producer's forward until the last step that reads it:
//  - forward: every consumer;
//  - backward (train only), as the ops declare in OpInfo::keep: the producer, when
//    it keeps its outputs, and each consumer that keeps its inputs.
// Graph inputs are the caller's and stay set until replaced; pinned values (what
// the caller reads after the step) and values nothing reads (the loss) live until
// the next forward.
//
// Activation checkpointing (train only): consecutive model blocks (Graph::begin_block)
// form segments. Inside a segment, values no node outside reads ("inner" values) and
// the nodes' saved tensors are dropped after forward, as if no backward needed them;
// just before the backward of the segment's last node the segment's forward runs
// again (the recompute: same RNG keys, so the same bits; batch norm leaves its
// running statistics alone), and from then on the usual backward rule applies. The
// segment's inputs live until that recompute.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace dtrain::graph {

struct BackwardSet;
// Whether node `node`'s backward reads the value in its `input` / output slots (with
// `set`, as it runs under optimizer.freeze: BackwardSet::keep).
bool keeps_inputs(const Node& node, const BackwardSet* set = nullptr);
bool keeps_outputs(const Node& node, const BackwardSet* set = nullptr);

// optimizer.freeze (Executor::set_frozen): what backward does when some parameters are
// frozen, the one rule the executor follows and the memory planner replays.
//  - frozen: per parameter (param_layout() order), 1 where frozen. An op that can
//    (Op::skips_param_grad) computes no gradient for a frozen parameter.
//  - works / needs (empty: every node and value; only where the executor prunes): a
//    node runs backward when it has a trainable parameter or an input that needs a
//    gradient; a value needs one when a working node made it. A node that does not
//    work keeps nothing for backward (no saved tensors, no kept inputs or outputs), and
//    a working node computes no gradient for an input that needs none.
struct BackwardSet {
  std::vector<uint8_t> frozen;
  std::vector<uint8_t> works;
  std::vector<uint8_t> needs;
  bool runs(int node) const { return works.empty() || works[static_cast<size_t>(node)] != 0; }
  bool wants(ValueId v) const { return needs.empty() || needs[static_cast<size_t>(v)] != 0; }
  bool is_frozen(int param) const {
    return !frozen.empty() && frozen[static_cast<size_t>(param)] != 0;
  }
  // Whether node n's op computes no gradient for its k-th parameter (frozen, and the op
  // can skip it: Op::skips_param_grad).
  bool skips_grad(const Node& n, size_t k) const {
    return is_frozen(n.params[k]) && n.op->skips_param_grad(k);
  }
  // What node n's backward reads from forward: its OpInfo::keep, less what only the
  // gradients it skips would have read (Op::keep_skipping).
  Keep keep(const Node& n) const {
    uint32_t skipped = 0;
    for (size_t k = 0; k < n.params.size() && k < 32; ++k)
      if (skips_grad(n, k)) skipped |= 1u << k;
    return skipped != 0 ? n.op->keep_skipping(n.info.keep, skipped) : n.info.keep;
  }
  // Per parameter (empty: none): frozen, its gradient read-only zero pages (graph::
  // Executor's zero_grads): an op that computes it anyway writes a transient tensor.
  std::vector<char> scratch;
  bool scratch_grad(int param) const {
    return !scratch.empty() && scratch[static_cast<size_t>(param)] != 0;
  }
};
// prune: also works and needs (the executor runs the whole graph on parameters it
// owns); else the frozen flags alone. frozen empty: an empty set (nothing frozen).
BackwardSet backward_set(const Graph& graph, std::vector<uint8_t> frozen, bool prune);

struct Segment {
  int first = 0, last = 0;  // node indices, inclusive
};

struct Lifetimes {
  int steps = 0;              // N (eval) or 2N (train)
  std::vector<int> last_use;  // per value: the last step reading it; -1: kept (pinned, unread)
  std::vector<std::vector<ValueId>> release_after;  // per step: values released after it
  std::vector<Segment> segments;                    // checkpointed segments (train only)
  // Per segment: whether backward recomputes it (0: no node of it runs backward, set_frozen).
  std::vector<char> recomputed;
  std::vector<int> segment_of;  // per node: its segment, or -1
  // Per node of a segment: inner values released right after that node's recompute
  // forward (nothing in backward reads them).
  std::vector<std::vector<ValueId>> recompute_release;
};

// Whether value v dies after backward step `step` (its last reader), so that step's
// op may write its gradient over it (OpInfo::grad_in_place). Not a graph input, not
// pinned, not an inner value of a checkpointed segment read again later.
bool grad_in_place_ok(const Graph& graph, const Lifetimes& life, ValueId v, int step);

// After a forward over nodes [begin, end) (a pipeline stage, Executor::release_unused):
// per value, whether a later step of that range still reads it: a backward that keeps
// it, or the recompute of a checkpointed segment inside the range. Nothing in eval.
std::vector<char> read_after_forward(const Graph& graph, const Lifetimes& life, Mode mode,
                                     int begin, int end, const BackwardSet* set = nullptr);

// pinned: per value (graph.num_values() entries, or empty: none pinned).
// blocks_per_segment: 0 no checkpointing; k: segments of k consecutive blocks.
// cuts: blocks where segments start afresh (pipeline stages' first blocks: no segment
// straddles a stage), in increasing order; empty: none.
// set (train): a node that does not work reads nothing in backward, and a segment with
// no working node is not recomputed. Null: every node works.
Lifetimes plan_lifetimes(const Graph& graph, Mode mode, const std::vector<char>& pinned,
                         int blocks_per_segment = 0, const std::vector<int>& cuts = {},
                         const BackwardSet* set = nullptr);

}  // namespace dtrain::graph
