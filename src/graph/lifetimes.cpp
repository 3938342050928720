// See lifetimes.h.
#include "graph/lifetimes.h"

#include <algorithm>

namespace dtrain::graph {

bool keeps_inputs(const Node& node) {
  return node.info.keep == Keep::inputs || node.info.keep == Keep::inputs_and_outputs;
}

bool keeps_outputs(const Node& node) {
  return node.info.keep == Keep::outputs || node.info.keep == Keep::inputs_and_outputs;
}

Lifetimes plan_lifetimes(const Graph& graph, Mode mode, const std::vector<char>& pinned) {
  const int n = static_cast<int>(graph.nodes().size());
  const auto values = static_cast<size_t>(graph.num_values());
  Lifetimes life;
  life.steps = mode == Mode::train ? 2 * n : n;
  life.last_use.assign(values, -1);
  std::vector<char> read(values, 0);
  auto use = [&](ValueId v, int step) {
    const auto i = static_cast<size_t>(v);
    read[i] = 1;
    life.last_use[i] = std::max(life.last_use[i], step);
  };
  for (int i = 0; i < n; ++i) {
    const Node& node = graph.nodes()[static_cast<size_t>(i)];
    for (ValueId v : node.inputs) use(v, i);
    if (mode != Mode::train) continue;
    const int back = 2 * n - 1 - i;
    if (keeps_inputs(node))
      for (ValueId v : node.inputs) use(v, back);
    if (keeps_outputs(node))
      for (ValueId v : node.outputs) use(v, back);
  }
  life.release_after.assign(static_cast<size_t>(life.steps), {});
  for (size_t v = 0; v < values; ++v) {
    const bool input = graph.value(static_cast<ValueId>(v)).producer == -1;  // the caller's
    const bool pin = input || (!pinned.empty() && pinned[v]);
    if (pin || !read[v]) {
      life.last_use[v] = -1;
      continue;
    }
    life.release_after[static_cast<size_t>(life.last_use[v])].push_back(static_cast<ValueId>(v));
  }
  return life;
}

}  // namespace dtrain::graph
