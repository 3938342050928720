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
#pragma once

#include <vector>

#include "graph/graph.h"

namespace dtrain::graph {

// Whether node `node`'s backward reads the value in its `input` / output slots.
bool keeps_inputs(const Node& node);
bool keeps_outputs(const Node& node);

struct Lifetimes {
  int steps = 0;              // N (eval) or 2N (train)
  std::vector<int> last_use;  // per value: the last step reading it; -1: kept (pinned, unread)
  std::vector<std::vector<ValueId>> release_after;  // per step: values released after it
};

// pinned: per value (graph.num_values() entries, or empty: none pinned).
Lifetimes plan_lifetimes(const Graph& graph, Mode mode, const std::vector<char>& pinned);

}  // namespace dtrain::graph
