// ZeRO-3's gather schedule, shared by the runtime (runtime/zero_params.h) and the
// memory planner (graph/memory_plan.h) so that what the estimate counts is what the
// run does. A unit is the parameters of one model block (Graph::begin_block), or of
// one run of nodes outside any block (the stem, the head); a parameter belongs to the
// unit of its first user, so a tied parameter (an LM head's embedding) is gathered
// again by its later user. A unit is one range of the fp32 layout (its parameters'
// span: contiguous, as builders declare a block's parameters together), gathered as
// one all-gather into a buffer of the compute dtype. In a half run the parameters the
// policy keeps in f32 (the norms') are gathered each on its own, in f32 (`wide`).
// The schedule, before each node that uses parameters (the executor's pre_op hook):
// the held units this node does not use are released, the ones it uses are acquired
// (gathered now unless prefetched), and the next parameter-using node's units are
// prefetched: in forward (and evaluation) the next in node order, in backward the
// next the backward reaches. A recompute (activation checkpointing) acquires without
// prefetching. Nodes without parameters change nothing, so a block keeps its unit
// from its first to its last node; the head's unit, held at the end of forward, serves
// backward's first nodes; end_pass() releases everything (after backward, after an
// evaluation).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/executor.h"
#include "graph/graph.h"

namespace dtrain::graph {

struct ParamUnit {
  int64_t lo = 0, hi = 0;  // elements [lo, hi) of the fp32 layout
  std::vector<int> wide;   // its f32 parameters in a half run, gathered one by one
};

class ParamUnits {
 public:
  // f32_layout: the graph's parameters in the fp32 layout (every offset in f32
  // elements); `loss`: the value backward starts from (which nodes it reaches).
  ParamUnits(const Graph& graph, const std::vector<FlatEntry>& f32_layout, ValueId loss);
  const std::vector<ParamUnit>& units() const { return units_; }
  int unit_of(int param) const { return unit_of_[static_cast<size_t>(param)]; }
  const std::vector<int>& needs(int node) const { return needs_[static_cast<size_t>(node)]; }
  bool reached(int node) const { return reached_[static_cast<size_t>(node)] != 0; }
  int num_nodes() const { return static_cast<int>(needs_.size()); }

 private:
  std::vector<ParamUnit> units_;
  std::vector<int> unit_of_;             // per parameter
  std::vector<std::vector<int>> needs_;  // per node: the units of its parameters
  std::vector<char> reached_;            // per node: backward runs it
};

struct GatherActions {
  std::vector<int> release;   // held units to drop (wait for a pending gather first)
  std::vector<int> acquire;   // units the node uses: present after this (gathered if not held)
  std::vector<int> prefetch;  // units to start gathering for the next node
};

class GatherSchedule {
 public:
  explicit GatherSchedule(const ParamUnits& units);
  // Before node `node` runs in `phase` (the executor calls pre_op only for nodes the
  // backward reaches). Empty for a node without parameters.
  GatherActions before(int node, Phase phase);
  std::vector<int> end_pass();  // every held unit, now released
  bool held(int unit) const { return held_[static_cast<size_t>(unit)] != 0; }

 private:
  int next_user(int node, Phase phase) const;  // the next node with parameters, or -1

  const ParamUnits& units_;
  std::vector<char> held_;  // per unit: gathered or being gathered
};

}  // namespace dtrain::graph
