// See lifetimes.h.
#include "graph/lifetimes.h"

#include <algorithm>

namespace dtrain::graph {

bool keeps_inputs(const Node& node, const BackwardSet* set) {
  const Keep keep = set != nullptr ? set->keep(node) : node.info.keep;
  return keep == Keep::inputs || keep == Keep::inputs_and_outputs;
}

bool keeps_outputs(const Node& node, const BackwardSet* set) {
  const Keep keep = set != nullptr ? set->keep(node) : node.info.keep;
  return keep == Keep::outputs || keep == Keep::inputs_and_outputs;
}

namespace {

// Segments of `k` consecutive blocks, in node order. Blocks are contiguous node ranges
// (a builder adds a block's nodes one after another).
std::vector<Segment> segments_of(const Graph& graph, int k, const std::vector<int>& cuts) {
  std::vector<Segment> out;
  if (k <= 0) return out;
  const auto& nodes = graph.nodes();
  int current = -1;  // segment index of the open segment's first block
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const int b = nodes[static_cast<size_t>(i)].block;
    if (b < 0) {
      current = -1;
      continue;
    }
    // Counted from the last cut at or before b, each cut opening a fresh numbering.
    int from = 0, part = 0;
    for (size_t c = 0; c < cuts.size() && cuts[c] <= b; ++c) {
      from = cuts[c];
      part = static_cast<int>(c) + 1;
    }
    const int seg = part * graph.num_blocks() + (b - from) / k;
    if (seg != current || out.empty() || out.back().last != i - 1) {
      out.push_back({i, i});
      current = seg;
    } else {
      out.back().last = i;
    }
  }
  return out;
}

}  // namespace

std::vector<char> read_after_forward(const Graph& graph, const Lifetimes& life, Mode mode,
                                     int begin, int end, const BackwardSet* set) {
  std::vector<char> read(static_cast<size_t>(graph.num_values()), 0);
  if (mode != Mode::train) return read;
  const auto& nodes = graph.nodes();
  for (const Segment& seg : life.segments) {  // the recompute reads the segment's inputs
    if (seg.first < begin || seg.last >= end) continue;
    for (int i = seg.first; i <= seg.last; ++i)
      for (ValueId v : nodes[static_cast<size_t>(i)].inputs) {
        const int p = graph.value(v).producer;
        if (p < seg.first || p > seg.last) read[static_cast<size_t>(v)] = 1;
      }
  }
  for (int i = begin; i < end; ++i) {
    const Node& node = nodes[static_cast<size_t>(i)];
    if (keeps_inputs(node, set))
      for (ValueId v : node.inputs) read[static_cast<size_t>(v)] = 1;
    if (keeps_outputs(node, set))
      for (ValueId v : node.outputs) read[static_cast<size_t>(v)] = 1;
  }
  return read;
}

bool grad_in_place_ok(const Graph& graph, const Lifetimes& life, ValueId v, int step) {
  if (graph.value(v).producer < 0) return false;         // the caller's input
  return life.last_use[static_cast<size_t>(v)] == step;  // -1 (pinned, unread) never matches
}

BackwardSet backward_set(const Graph& graph, std::vector<uint8_t> frozen, bool prune) {
  BackwardSet set;
  if (std::find(frozen.begin(), frozen.end(), 1) == frozen.end()) return set;
  DTRAIN_CHECK(frozen.size() == graph.param_layout().size(), "{} frozen flags for {} parameters",
               frozen.size(), graph.param_layout().size());
  set.frozen = std::move(frozen);
  if (!prune) return set;
  set.needs.assign(static_cast<size_t>(graph.num_values()), 0);
  set.works.assign(graph.nodes().size(), 0);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {  // forward order: producers first
    const Node& n = graph.nodes()[i];
    bool work = false;
    for (int p : n.params) work = work || !set.frozen[static_cast<size_t>(p)];
    for (ValueId v : n.inputs) work = work || set.needs[static_cast<size_t>(v)];
    set.works[i] = work ? 1 : 0;
    for (ValueId v : n.outputs) set.needs[static_cast<size_t>(v)] = set.works[i];
  }
  return set;
}

Lifetimes plan_lifetimes(const Graph& graph, Mode mode, const std::vector<char>& pinned,
                         int blocks_per_segment, const std::vector<int>& cuts,
                         const BackwardSet* set) {
  const auto& nodes = graph.nodes();
  const int n = static_cast<int>(nodes.size());
  const auto values = static_cast<size_t>(graph.num_values());
  const bool train = mode == Mode::train;
  Lifetimes life;
  life.steps = train ? 2 * n : n;
  life.last_use.assign(values, -1);
  life.segment_of.assign(static_cast<size_t>(n), -1);
  life.recompute_release.assign(static_cast<size_t>(n), {});
  if (train) life.segments = segments_of(graph, blocks_per_segment, cuts);
  for (size_t s = 0; s < life.segments.size(); ++s)
    for (int i = life.segments[s].first; i <= life.segments[s].last; ++i)
      life.segment_of[static_cast<size_t>(i)] = static_cast<int>(s);
  auto segment_of_value = [&](ValueId v) {
    const int p = graph.value(v).producer;
    return p < 0 ? -1 : life.segment_of[static_cast<size_t>(p)];
  };
  // Inner values: produced in a segment and read by no node outside it.
  std::vector<char> inner(values, 0);
  for (size_t v = 0; v < values; ++v) inner[v] = segment_of_value(static_cast<ValueId>(v)) >= 0;
  for (const Node& node : nodes) {
    for (ValueId v : node.inputs) {
      const int s = segment_of_value(v);
      if (s >= 0 && life.segment_of[static_cast<size_t>(&node - nodes.data())] != s)
        inner[static_cast<size_t>(v)] = 0;
    }
  }
  std::vector<char> read(values, 0);
  std::vector<int> last_forward(values, -1), last_backward(values, -1);
  auto use = [&](ValueId v, int step, bool backward) {
    const auto i = static_cast<size_t>(v);
    read[i] = 1;
    int& last = backward ? last_backward[i] : last_forward[i];
    last = std::max(last, step);
  };
  // set: whether some node of segment s runs backward (else it is not recomputed).
  life.recomputed.assign(life.segments.size(), 1);
  if (set != nullptr && !set->works.empty()) {
    for (size_t s = 0; s < life.segments.size(); ++s) {
      life.recomputed[s] = 0;
      for (int i = life.segments[s].first; i <= life.segments[s].last; ++i)
        life.recomputed[s] = static_cast<char>(life.recomputed[s] || set->runs(i));
    }
  }
  for (int i = 0; i < n; ++i) {
    const Node& node = nodes[static_cast<size_t>(i)];
    for (ValueId v : node.inputs) use(v, i, false);
    if (!train) continue;
    const int back = 2 * n - 1 - i;
    const bool runs = set == nullptr || set->runs(i);
    if (runs && keeps_inputs(node, set))
      for (ValueId v : node.inputs) use(v, back, true);
    if (runs && keeps_outputs(node, set))
      for (ValueId v : node.outputs) use(v, back, true);
    const int s = life.segment_of[static_cast<size_t>(i)];
    if (s >= 0 && life.recomputed[static_cast<size_t>(s)]) {  // the recompute reads the
                                                              // segment's inputs from outside
      const int recompute = 2 * n - 1 - life.segments[static_cast<size_t>(s)].last;
      for (ValueId v : node.inputs)
        if (segment_of_value(v) != s) use(v, recompute, true);
    }
  }
  life.release_after.assign(static_cast<size_t>(life.steps), {});
  for (size_t v = 0; v < values; ++v) {
    const auto id = static_cast<ValueId>(v);
    const bool input = graph.value(id).producer == -1;  // the caller's
    const bool pin = input || (!pinned.empty() && pinned[v]);
    if (pin || !read[v]) continue;
    if (inner[v]) {
      // Forward: gone after its last forward reader. Recompute: made again, then gone
      // after its last backward reader, or right after its last recompute reader.
      const int producer = graph.value(id).producer;
      life.release_after[static_cast<size_t>(std::max(last_forward[v], producer))].push_back(id);
      if (last_backward[v] >= 0) {
        life.release_after[static_cast<size_t>(last_backward[v])].push_back(id);
        life.last_use[v] = last_backward[v];
      } else {
        life.recompute_release[static_cast<size_t>(std::max(last_forward[v], producer))].push_back(
            id);
        life.last_use[v] = last_forward[v];
      }
      continue;
    }
    life.last_use[v] = std::max(last_forward[v], last_backward[v]);
    life.release_after[static_cast<size_t>(life.last_use[v])].push_back(id);
  }
  return life;
}

}  // namespace dtrain::graph
