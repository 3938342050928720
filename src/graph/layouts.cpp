#include "graph/layouts.h"

#include <algorithm>

namespace dtrain::graph {

namespace {

bool makes_blocked(const Op& op) {
  return op.blocked_form() == BlockedForm::alike || op.blocked_form() == BlockedForm::free;
}
bool reads_blocked(const Op& op) { return op.blocked_form() != BlockedForm::none; }

}  // namespace

std::vector<int32_t> channel_blocks(const Graph& graph, int64_t block, std::span<const char> pinned,
                                    int begin, int end, bool bf16) {
  const auto nv = static_cast<size_t>(graph.num_values());
  std::vector<int32_t> out(nv, 0);
  if (block <= 0) return out;
  std::vector<int> readers(nv, 0);
  std::vector<char> ok(nv, 1);
  const auto& nodes = graph.nodes();
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    const bool inside = i >= begin && i < end;
    for (ValueId v : n.inputs) {
      ++readers[static_cast<size_t>(v)];
      if (!inside || !reads_blocked(*n.op)) ok[static_cast<size_t>(v)] = 0;
    }
    for (ValueId v : n.outputs) {
      if (!inside || !makes_blocked(*n.op)) ok[static_cast<size_t>(v)] = 0;
    }
  }
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = graph.value(static_cast<ValueId>(v));
    const Shape& s = val.spec.shape;
    const bool dtype = val.spec.dtype == DType::f32 || (bf16 && val.spec.dtype == DType::bf16);
    const bool fits = val.producer >= 0 && dtype && s.rank() == 4 && s[1] % block == 0 &&
                      readers[v] > 0 && (pinned.empty() || pinned[v] == 0);
    if (!fits) ok[v] = 0;
  }
  // Operands alike: one plain operand makes the node's others plain; until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = begin; i < end; ++i) {
      const Node& n = nodes[static_cast<size_t>(i)];
      if (n.op->blocked_form() != BlockedForm::alike) continue;
      bool all = true;
      for (ValueId v : n.inputs) all = all && ok[static_cast<size_t>(v)];
      for (ValueId v : n.outputs) all = all && ok[static_cast<size_t>(v)];
      if (all) continue;
      for (const auto* vs : {&n.inputs, &n.outputs}) {
        for (ValueId v : *vs) {
          changed = changed || ok[static_cast<size_t>(v)];
          ok[static_cast<size_t>(v)] = 0;
        }
      }
    }
  }
  for (size_t v = 0; v < nv; ++v) out[v] = ok[v] ? static_cast<int32_t>(block) : 0;
  return out;
}

}  // namespace dtrain::graph
