// The tensor-parallel pass: pattern search over the single-device graph, then one
// replace_ops with each split node's share (graph/tensor_parallel.h).
#include "graph/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace dtrain::graph {

std::pair<int64_t, int64_t> share_of(int64_t total, int rank, int size) {
  const int64_t base = total / size, extra = total % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

const TensorParallelPlan::Split* TensorParallelPlan::find(int node) const {
  for (const Split& s : splits)
    if (s.node == node) return &s;
  return nullptr;
}

namespace {

struct Use {
  int node = -1;
  size_t slot = 0;
};

class Planner {
 public:
  Planner(const Graph& g, int size, int rank) : g_(g), size_(size), rank_(rank) {
    uses_.resize(static_cast<size_t>(g.num_values()));
    for (size_t n = 0; n < g.nodes().size(); ++n) {
      const Node& node = g.nodes()[n];
      for (size_t k = 0; k < node.inputs.size(); ++k)
        uses_[static_cast<size_t>(node.inputs[k])].push_back({static_cast<int>(n), k});
    }
    role_.resize(g.nodes().size());
  }

  TensorParallelPlan run() {
    TensorParallelPlan plan;
    plan.size = size_;
    plan.rank = rank_;
    if (size_ == 1) return plan;
    for (size_t n = 0; n < g_.nodes().size(); ++n) pair_from(static_cast<int>(n));
    vocabulary(plan);
    for (size_t n = 0; n < role_.size(); ++n) {
      if (role_[n]) plan.splits.push_back({static_cast<int>(n), *role_[n]});
    }
    if (plan.splits.empty()) {
      throw Error(fmt::format("parallel.tensor: {} ranks, but this model has no layer the "
                              "tensor-parallel pass can split",
                              size_),
                  "tensor parallelism splits transformer attention, MLPs and vocabularies; "
                  "set parallel.tensor: 1 (use parallel.data or parallel.pipeline)");
    }
    return plan;
  }

 private:
  std::string_view kind(int n) const { return g_.nodes()[static_cast<size_t>(n)].op->kind(); }
  const Node& node(int n) const { return g_.nodes()[static_cast<size_t>(n)]; }
  const std::vector<Use>& uses(ValueId v) const { return uses_[static_cast<size_t>(v)]; }

  TpShare even(int64_t total, const char* key) const {
    if (total % size_ != 0) {
      throw Error(fmt::format("parallel.tensor: {} ranks do not divide the {} {} of this model",
                              size_, total, key),
                  fmt::format("choose parallel.tensor dividing model.{}", key));
    }
    TpShare s;
    s.count = total / size_;
    s.begin = rank_ * s.count;
    s.total = total;
    return s;
  }

  // A linear (or linear_gelu) whose output reaches one plain linear through
  // activations and at most one attention: column, [heads], row.
  void pair_from(int first) {
    if (role_[static_cast<size_t>(first)] ||
        (kind(first) != "linear" && kind(first) != "linear_gelu"))
      return;
    std::vector<int> chain;
    int attention = -1;
    ValueId v = node(first).outputs[0];
    for (;;) {
      if (uses(v).size() != 1 || uses(v)[0].slot != 0) return;
      const int next = uses(v)[0].node;
      const std::string_view k = kind(next);
      if (k == "linear") {
        if (role_[static_cast<size_t>(next)]) return;
        chain.push_back(next);
        break;
      }
      if (k == "self_attention" && attention < 0) {
        attention = next;
      } else if (k != "activation") {
        return;
      }
      chain.push_back(next);
      v = node(next).outputs[0];
    }
    const int last = chain.back();
    const int64_t features = node(first).info.params[0].shape[0];  // weight [out, in]
    TpShare column;
    if (attention >= 0) {
      const int64_t heads = node(attention).info.saved[0].shape[1];  // [B, H, T, D]
      TpShare h = even(heads, "heads");
      h.role = TpRole::heads;
      role_[static_cast<size_t>(attention)] = h;
      const int64_t dim = features / 3 / heads;
      column.role = TpRole::column;
      column.chunks = 3;
      column.total = features / 3;
      column.begin = h.begin * dim;
      column.count = h.count * dim;
    } else {
      column = even(features, "ffn");
      column.role = TpRole::column;
    }
    role_[static_cast<size_t>(first)] = column;
    TpShare row = column;
    row.role = TpRole::row;
    row.chunks = 1;
    role_[static_cast<size_t>(last)] = row;
  }

  // Token embeddings split their vocabulary; a linear tied to the word table splits
  // its classes and must feed a cross-entropy alone.
  void vocabulary(TensorParallelPlan& plan) {
    for (size_t e = 0; e < g_.nodes().size(); ++e) {
      if (kind(static_cast<int>(e)) != "token_embedding") continue;
      const int table = node(static_cast<int>(e)).params[0];
      const int64_t vocab = g_.param_layout()[static_cast<size_t>(table)].spec.shape[0];
      const auto [begin, count] = share_of(vocab, rank_, size_);
      const TpShare share{TpRole::vocab, nullptr, begin, count, vocab, 1};
      role_[e] = share;
      for (size_t n = 0; n < g_.nodes().size(); ++n) {
        const Node& user = g_.nodes()[n];
        if (n == e || std::find(user.params.begin(), user.params.end(), table) == user.params.end())
          continue;
        if (user.op->kind() != "linear" || user.params[0] != table || role_[n]) {
          throw Error(fmt::format("parallel.tensor: graph node \"{}\" ({}) shares the "
                                  "vocabulary table, which tensor parallelism splits, and "
                                  "has no split form",
                                  user.name, user.op->kind()),
                      "set parallel.tensor: 1 for this model");
        }
        role_[n] = share;
        const ValueId logits = user.outputs[0];
        for (const Use& u : uses(logits)) {
          if (kind(u.node) != "softmax_cross_entropy" || u.slot != 0) {
            throw Error(fmt::format("parallel.tensor: the logits of \"{}\" are split over the "
                                    "vocabulary, and \"{}\" ({}) reads them; only a "
                                    "softmax_cross_entropy can",
                                    user.name, node(u.node).name, kind(u.node)),
                        "set parallel.tensor: 1 for this model");
          }
          role_[static_cast<size_t>(u.node)] = share;
        }
        plan.vocab_values.push_back(logits);
        plan.vocab_begin = begin;
        plan.vocab_count = count;
        plan.vocab_total = vocab;
      }
    }
  }

  const Graph& g_;
  int size_, rank_;
  std::vector<std::vector<Use>> uses_;
  std::vector<std::optional<TpShare>> role_;
};

class Placeholder final : public TensorGroup {
 public:
  Placeholder(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(Tensor&, GroupReduce) override {
    DTRAIN_CHECK(false, "a placeholder tensor-parallel group cannot all-reduce");
  }

 private:
  int rank_, size_;
};

std::string_view role_name(TpRole r) {
  switch (r) {
    case TpRole::column:
      return "column";
    case TpRole::row:
      return "row";
    case TpRole::heads:
      return "heads";
    case TpRole::vocab:
      return "vocab";
  }
  return "?";
}

}  // namespace

TensorParallelPlan plan_tensor_parallel(const Graph& g, int size, int rank) {
  DTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor rank {} of {}", rank, size);
  return Planner(g, size, rank).run();
}

TensorParallelPlan split_tensor_parallel(Graph& g, std::shared_ptr<TensorGroup> group) {
  TensorParallelPlan plan = plan_tensor_parallel(g, group->size(), group->rank());
  std::vector<std::unique_ptr<Op>> ops(g.nodes().size());
  for (const TensorParallelPlan::Split& s : plan.splits) {
    TpShare share = s.share;
    share.group = group;
    const Node& n = g.nodes()[static_cast<size_t>(s.node)];
    ops[static_cast<size_t>(s.node)] = n.op->tensor_share(share);
    if (!ops[static_cast<size_t>(s.node)]) {
      throw Error(fmt::format("parallel.tensor: graph node \"{}\" ({}) has no {} split", n.name,
                              n.op->kind(), role_name(share.role)),
                  "set parallel.tensor: 1 for this model");
    }
  }
  g.replace_ops(std::move(ops));
  return plan;
}

std::string format_tensor_plan(const Graph& g, const TensorParallelPlan& plan) {
  std::string out;
  for (const TensorParallelPlan::Split& s : plan.splits) {
    const TpShare& h = s.share;
    const char* unit = h.role == TpRole::heads   ? "heads"
                       : h.role == TpRole::vocab ? "classes"
                                                 : "features";
    out += fmt::format("{}  {}  {} {}-{} of {}{}\n", g.nodes()[static_cast<size_t>(s.node)].name,
                       role_name(h.role), unit, h.begin, h.begin + h.count - 1, h.total,
                       h.chunks > 1 ? fmt::format(" (x{})", h.chunks) : "");
  }
  return out;
}

std::shared_ptr<TensorGroup> placeholder_group(int rank, int size) {
  return std::make_shared<Placeholder>(rank, size);
}

}  // namespace dtrain::graph
