// See param_units.h.
#include "graph/param_units.h"

#include <algorithm>

namespace dtrain::graph {

ParamUnits::ParamUnits(const Graph& graph, const std::vector<FlatEntry>& f32_layout, ValueId loss) {
  const auto& nodes = graph.nodes();
  const size_t n = nodes.size();
  DTRAIN_CHECK(f32_layout.size() == graph.param_layout().size(), "{} layout entries for {} params",
               f32_layout.size(), graph.param_layout().size());
  // The unit key of each node: a new one wherever the block index changes.
  std::vector<int> key(n, -1);
  int keys = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i == 0 || nodes[i].block != nodes[i - 1].block) ++keys;
    key[i] = keys - 1;
  }
  unit_of_.assign(f32_layout.size(), -1);
  std::vector<int> unit_of_key(static_cast<size_t>(keys), -1);
  for (size_t i = 0; i < n; ++i) {
    for (int p : nodes[i].params) {
      if (unit_of_[static_cast<size_t>(p)] >= 0) continue;  // tied: its first user's unit
      int& u = unit_of_key[static_cast<size_t>(key[i])];
      const FlatEntry& e = f32_layout[static_cast<size_t>(p)];
      const int64_t lo = e.offset, hi = e.offset + e.spec.shape.numel();
      if (u < 0) {
        u = static_cast<int>(units_.size());
        units_.push_back({lo, hi});
      } else {
        units_[static_cast<size_t>(u)].lo = std::min(units_[static_cast<size_t>(u)].lo, lo);
        units_[static_cast<size_t>(u)].hi = std::max(units_[static_cast<size_t>(u)].hi, hi);
      }
      unit_of_[static_cast<size_t>(p)] = u;
      if (graph.policy().half() &&
          graph.param_layout()[static_cast<size_t>(p)].spec.dtype == DType::f32)
        units_[static_cast<size_t>(u)].wide.push_back(p);
    }
  }
  needs_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    for (int p : nodes[i].params) needs_[i].push_back(unit_of_[static_cast<size_t>(p)]);
    std::sort(needs_[i].begin(), needs_[i].end());
    needs_[i].erase(std::unique(needs_[i].begin(), needs_[i].end()), needs_[i].end());
  }
  // Backward reaches a node when one of its outputs leads to the loss (the executor's
  // rule: a gradient arrived for an output).
  reached_.assign(n, 0);
  std::vector<char> grad(static_cast<size_t>(graph.num_values()), 0);
  grad[static_cast<size_t>(loss)] = 1;
  for (size_t i = n; i-- > 0;) {
    for (ValueId v : nodes[i].outputs) reached_[i] = reached_[i] || grad[static_cast<size_t>(v)];
    if (!reached_[i]) continue;
    for (ValueId v : nodes[i].inputs)
      if (graph.value(v).requires_grad) grad[static_cast<size_t>(v)] = 1;
  }
}

GatherSchedule::GatherSchedule(const ParamUnits& units)
    : units_(units), held_(units.units().size(), 0) {}

int GatherSchedule::next_user(int node, Phase phase) const {
  if (phase == Phase::forward) {
    for (int j = node + 1; j < units_.num_nodes(); ++j)
      if (!units_.needs(j).empty()) return j;
  } else if (phase == Phase::backward) {
    for (int j = node - 1; j >= 0; --j)
      if (!units_.needs(j).empty() && units_.reached(j)) return j;
  }
  return -1;  // a recompute does not prefetch
}

GatherActions GatherSchedule::before(int node, Phase phase) {
  GatherActions a;
  const std::vector<int>& need = units_.needs(node);
  if (need.empty()) return a;
  for (size_t u = 0; u < held_.size(); ++u) {
    if (held_[u] && !std::binary_search(need.begin(), need.end(), static_cast<int>(u))) {
      a.release.push_back(static_cast<int>(u));
      held_[u] = 0;
    }
  }
  for (int u : need) {
    a.acquire.push_back(u);
    held_[static_cast<size_t>(u)] = 1;
  }
  const int next = next_user(node, phase);
  if (next >= 0) {
    for (int u : units_.needs(next)) {
      if (held_[static_cast<size_t>(u)]) continue;
      a.prefetch.push_back(u);
      held_[static_cast<size_t>(u)] = 1;
    }
  }
  return a;
}

std::vector<int> GatherSchedule::end_pass() {
  std::vector<int> out;
  for (size_t u = 0; u < held_.size(); ++u) {
    if (held_[u]) out.push_back(static_cast<int>(u));
    held_[u] = 0;
  }
  return out;
}

}  // namespace dtrain::graph
