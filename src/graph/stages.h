// Pipeline stages: the graph's nodes cut into contiguous ranges at model-block
// boundaries (Graph::begin_block: a residual block, a transformer layer), the nodes
// before the first block joining the first stage and those after the last block the
// last. Each stage runs its range on its own rank (graph::Executor::set_range); what
// crosses a cut is every value made before the cut that a node after it reads (an
// activation, BERT's attention mask, the gathered labels), sent forward whole and
// its gradient sent back. A value a later stage still needs passes through the
// stages between (each receives it and sends it on), so a stage talks only to its
// neighbours. Pure arithmetic on the graph: `dtrain validate` prints the plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace dtrain::graph {

struct Stage {
  int begin = 0, end = 0;              // nodes [begin, end)
  int first_block = 0, end_block = 0;  // model blocks [first_block, end_block)
  double flops = 0;                    // forward FLOPs of its nodes (for the whole batch)
  int64_t param_elems = 0;             // elements of the parameters its nodes use
  // Values made before `begin` (not graph inputs) that a node from `begin` on reads, in
  // value order: what this stage receives from the one before (empty for the first).
  std::vector<ValueId> receives;
};

// `stages` ranges balanced by forward FLOPs (backward is proportional): the cut points
// that make the largest stage's FLOPs smallest (ties: the earliest cuts). Error naming
// parallel.pipeline when the graph has fewer blocks than stages.
std::vector<Stage> plan_stages(const Graph& graph, int stages);

// The same plan with the blocks per stage given (blocks[s] blocks for stage s, every
// stage at least one, summing to the graph's blocks). Error naming
// parallel.pipeline_blocks otherwise.
std::vector<Stage> stages_from_blocks(const Graph& graph, const std::vector<int>& blocks);

// Parameters used by nodes of more than one stage (weights tied across a cut: GPT-2's
// token embedding and LM head), as indices into the graph's parameters.
std::vector<int> params_across_stages(const Graph& graph, const std::vector<Stage>& stages);

// Which of the graph's parameters the nodes of `stage` use (one flag per parameter):
// what the stage's executor holds (graph::Executor's `stage`) and sums over data ranks.
std::vector<char> stage_params(const Graph& graph, const Stage& stage);
// The same as indices, increasing: the parameters a stage's gradient buckets hold
// (dist::plan_buckets_of).
std::vector<int> stage_param_indices(const Graph& graph, const Stage& stage);

// One line per stage: its blocks, nodes, FLOPs (and share), parameters, and what it
// receives (values and bytes per micro-batch).
std::string format_stages(const Graph& graph, const std::vector<Stage>& stages);

}  // namespace dtrain::graph
