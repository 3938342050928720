// See stages.h.
#include "graph/stages.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "core/error.h"

namespace dtrain::graph {

namespace {

// Per block: its first node; the nodes before block 0 belong to block 0 and those
// after a block's last node (up to the next block's first) to that block.
std::vector<int> block_starts(const Graph& graph) {
  std::vector<int> starts(static_cast<size_t>(graph.num_blocks()), -1);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const int b = graph.nodes()[i].block;
    if (b >= 0 && starts[static_cast<size_t>(b)] < 0)
      starts[static_cast<size_t>(b)] = static_cast<int>(i);
  }
  if (!starts.empty()) starts[0] = 0;
  return starts;
}

std::vector<Stage> cut(const Graph& graph, const std::vector<int>& first_blocks) {
  const std::vector<int> starts = block_starts(graph);
  const int n = static_cast<int>(graph.nodes().size());
  std::vector<Stage> out(first_blocks.size());
  for (size_t s = 0; s < first_blocks.size(); ++s) {
    Stage& st = out[s];
    st.first_block = first_blocks[s];
    st.end_block = s + 1 < first_blocks.size() ? first_blocks[s + 1] : graph.num_blocks();
    st.begin = starts[static_cast<size_t>(st.first_block)];
    st.end = s + 1 < first_blocks.size() ? starts[static_cast<size_t>(st.end_block)] : n;
    std::set<int> params;
    for (int i = st.begin; i < st.end; ++i) {
      const Node& node = graph.nodes()[static_cast<size_t>(i)];
      st.flops += node.info.flops;
      params.insert(node.params.begin(), node.params.end());
    }
    for (int p : params)
      st.param_elems += graph.param_layout()[static_cast<size_t>(p)].spec.shape.numel();
    if (s == 0) continue;
    std::set<ValueId> receives;
    for (int i = st.begin; i < n; ++i)
      for (ValueId v : graph.nodes()[static_cast<size_t>(i)].inputs) {
        const int producer = graph.value(v).producer;
        if (producer >= 0 && producer < st.begin) receives.insert(v);
      }
    st.receives.assign(receives.begin(), receives.end());
  }
  return out;
}

}  // namespace

std::vector<Stage> plan_stages(const Graph& graph, int stages) {
  const int blocks = graph.num_blocks();
  if (stages < 1 || blocks < stages) {
    throw Error(fmt::format("parallel.pipeline: {} stages, but the model has {} blocks (residual "
                            "blocks or transformer layers) to cut between them",
                            stages, blocks),
                "use at most as many pipeline stages as the model has blocks");
  }
  // FLOPs per block, the nodes around the blocks counted with their block.
  const std::vector<int> starts = block_starts(graph);
  std::vector<double> cost(static_cast<size_t>(blocks), 0.0);
  for (int b = 0; b < blocks; ++b) {
    const int from = starts[static_cast<size_t>(b)];
    const int to = b + 1 < blocks ? starts[static_cast<size_t>(b) + 1]
                                  : static_cast<int>(graph.nodes().size());
    for (int i = from; i < to; ++i)
      cost[static_cast<size_t>(b)] += graph.nodes()[static_cast<size_t>(i)].info.flops;
  }
  std::vector<double> prefix(static_cast<size_t>(blocks) + 1, 0.0);
  for (int b = 0; b < blocks; ++b)
    prefix[static_cast<size_t>(b) + 1] =
        prefix[static_cast<size_t>(b)] + cost[static_cast<size_t>(b)];
  // best[s][b]: the least possible largest stage when the first b blocks form s stages;
  // the last cut that achieves it (the earliest, on ties) in from[s][b].
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(blocks) + 1, inf));
  std::vector<std::vector<int>> from(static_cast<size_t>(stages) + 1,
                                     std::vector<int>(static_cast<size_t>(blocks) + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int b = s; b <= blocks; ++b)
      for (int a = s - 1; a < b; ++a) {
        const double v = std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(a)],
                                  prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)]);
        if (v < best[static_cast<size_t>(s)][static_cast<size_t>(b)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(b)] = v;
          from[static_cast<size_t>(s)][static_cast<size_t>(b)] = a;
        }
      }
  std::vector<int> first(static_cast<size_t>(stages));
  for (int s = stages, b = blocks; s >= 1; --s) {
    b = from[static_cast<size_t>(s)][static_cast<size_t>(b)];
    first[static_cast<size_t>(s) - 1] = b;
  }
  return cut(graph, first);
}

std::vector<Stage> stages_from_blocks(const Graph& graph, const std::vector<int>& blocks) {
  int total = 0;
  for (int b : blocks) {
    if (b < 1) {
      throw Error(fmt::format("parallel.pipeline_blocks: {} blocks for a stage", b),
                  "give every stage at least one block");
    }
    total += b;
  }
  if (blocks.empty() || total != graph.num_blocks()) {
    throw Error(fmt::format("parallel.pipeline_blocks: {} blocks in all, but the model has {}",
                            total, graph.num_blocks()),
                "the blocks per stage must add up to the model's blocks");
  }
  std::vector<int> first;
  int at = 0;
  for (int b : blocks) {
    first.push_back(at);
    at += b;
  }
  return cut(graph, first);
}

std::vector<int> params_across_stages(const Graph& graph, const std::vector<Stage>& stages) {
  std::vector<int> stage_of(graph.param_layout().size(), -1);
  std::set<int> across;
  for (size_t s = 0; s < stages.size(); ++s)
    for (int i = stages[s].begin; i < stages[s].end; ++i)
      for (int p : graph.nodes()[static_cast<size_t>(i)].params) {
        int& at = stage_of[static_cast<size_t>(p)];
        if (at >= 0 && at != static_cast<int>(s)) across.insert(p);
        at = static_cast<int>(s);
      }
  return {across.begin(), across.end()};
}

std::vector<char> stage_params(const Graph& graph, const Stage& stage) {
  std::vector<char> used(graph.param_layout().size(), 0);
  for (int i = stage.begin; i < stage.end; ++i)
    for (int p : graph.nodes()[static_cast<size_t>(i)].params) used[static_cast<size_t>(p)] = 1;
  return used;
}

std::vector<int> stage_param_indices(const Graph& graph, const Stage& stage) {
  const std::vector<char> used = stage_params(graph, stage);
  std::vector<int> own;
  for (size_t p = 0; p < used.size(); ++p)
    if (used[p]) own.push_back(static_cast<int>(p));
  return own;
}

std::string format_stages(const Graph& graph, const std::vector<Stage>& stages) {
  double total = 0;
  for (const Stage& s : stages) total += s.flops;
  std::string out;
  for (size_t k = 0; k < stages.size(); ++k) {
    const Stage& s = stages[k];
    int64_t bytes = 0;
    for (ValueId v : s.receives) {
      const TensorSpec& spec = graph.value(v).spec;
      bytes += spec.shape.numel() * static_cast<int64_t>(dtype_size(spec.dtype));
    }
    out += fmt::format(
        "stage {}: blocks {}-{}, nodes {}-{}, {:.3g} GFLOP forward ({:.0f}%), {} parameters{}\n", k,
        s.first_block, s.end_block - 1, s.begin, s.end - 1, s.flops / 1e9,
        total > 0 ? 100.0 * s.flops / total : 0.0, s.param_elems,
        k == 0 ? std::string()
               : fmt::format(", receives {} value(s), {} bytes per micro-batch", s.receives.size(),
                             bytes));
  }
  return out;
}

}  // namespace dtrain::graph
