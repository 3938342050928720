// Graph construction: shape inference through Op::infer and parameter naming.
#include "graph/graph.h"

#include <unordered_set>

namespace dtrain::graph {

void Graph::set_policy(const DTypePolicy& policy) {
  DTRAIN_CHECK(nodes_.empty(), "the dtype policy is set before the first node");
  DTRAIN_CHECK(
      policy.compute == DType::f32 || policy.compute == DType::f16 || policy.compute == DType::bf16,
      "compute dtype {}", dtype_name(policy.compute));
  policy_ = policy;
}

ValueId Graph::input(const std::string& name, const Shape& shape, DType dtype) {
  values_.push_back({name, {shape, dtype}, -1, false});
  return static_cast<ValueId>(values_.size() - 1);
}

const Value& Graph::value(ValueId v) const {
  DTRAIN_CHECK(v >= 0 && v < num_values(), "value id {} of {}", v, num_values());
  return values_[static_cast<size_t>(v)];
}

namespace {

const Tie* find_tie(const std::vector<Tie>& ties, int local) {
  for (const Tie& t : ties)
    if (t.local == local) return &t;
  return nullptr;
}

}  // namespace

void Graph::check_ties(const std::string& name, const OpInfo& info,
                       const std::vector<Tie>& ties) const {
  for (const Tie& t : ties) {
    if (t.local < 0 || t.local >= static_cast<int>(info.params.size())) {
      throw Error(fmt::format("graph node \"{}\": tie of parameter {}, but the op has {}", name,
                              t.local, info.params.size()));
    }
    if (t.param < 0 || t.param >= static_cast<int>(params_.size())) {
      throw Error(fmt::format("graph node \"{}\": tie to parameter {}, but the graph has {}", name,
                              t.param, params_.size()));
    }
    const ParamSpec& mine = info.params[static_cast<size_t>(t.local)];
    const FlatEntry& theirs = params_[static_cast<size_t>(t.param)];
    if (!(mine.shape == theirs.spec.shape) || mine.dtype != theirs.spec.dtype) {
      throw Error(fmt::format(
          "graph node \"{}\": parameter {} {}{} cannot be tied to \"{}\" of node \"{}\", "
          "which is {}{}",
          name, mine.name, dtype_name(mine.dtype), mine.shape.str(), theirs.name,
          nodes_[static_cast<size_t>(theirs.node)].name, dtype_name(theirs.spec.dtype),
          theirs.spec.shape.str()));
    }
  }
}

std::vector<ValueId> Graph::add(const std::string& name, std::unique_ptr<Op> op,
                                const std::vector<ValueId>& inputs, const std::vector<Tie>& ties) {
  for (const Node& n : nodes_) {
    if (n.name == name) throw Error(fmt::format("graph: two nodes are named \"{}\"", name));
  }
  std::vector<TensorSpec> specs;
  bool any_grad = false;
  for (ValueId v : inputs) {
    specs.push_back(value(v).spec);
    any_grad = any_grad || value(v).requires_grad;
  }
  Node node;
  op->bind_policy(policy_);
  try {
    node.info = op->infer(specs);
  } catch (const Error& e) {
    throw Error(fmt::format("graph node \"{}\": {}", name, e.message()), e.hint());
  }
  // The policy decides every parameter's dtype; buffers (running statistics) stay f32.
  for (ParamSpec& p : node.info.params) p.dtype = policy_.param(p.group);
  for (ParamSpec& b : node.info.buffers) b.dtype = DType::f32;
  check_ties(name, node.info, ties);
  node.name = name;
  node.inputs = inputs;
  node.block = open_block_;
  for (size_t i = 0; i < node.info.params.size(); ++i) {
    if (const Tie* t = find_tie(ties, static_cast<int>(i))) {
      node.params.push_back(t->param);
      continue;
    }
    const ParamSpec& p = node.info.params[i];
    node.params.push_back(static_cast<int>(params_.size()));
    params_.push_back({name + "." + p.name, p, static_cast<int>(nodes_.size()), 0});
  }
  for (const ParamSpec& b : node.info.buffers) {
    node.buffers.push_back(static_cast<int>(buffers_.size()));
    buffers_.push_back({name + "." + b.name, b, static_cast<int>(nodes_.size()), 0});
  }
  const bool grad = any_grad || !node.info.params.empty();
  for (size_t i = 0; i < node.info.outputs.size(); ++i) {
    const TensorSpec& s = node.info.outputs[i];
    const std::string vname = node.info.outputs.size() == 1 ? name : fmt::format("{}:{}", name, i);
    values_.push_back({vname, s, static_cast<int>(nodes_.size()), grad && is_floating(s.dtype)});
    node.outputs.push_back(static_cast<ValueId>(values_.size() - 1));
  }
  node.op = std::move(op);
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

void Graph::replace_ops(std::vector<std::unique_ptr<Op>> ops) {
  DTRAIN_CHECK(ops.size() == nodes_.size(), "replace_ops: {} ops for {} nodes", ops.size(),
               nodes_.size());
  for (size_t n = 0; n < nodes_.size(); ++n) {
    Node& node = nodes_[n];
    if (ops[n]) {
      ops[n]->bind_policy(policy_);
      node.op = std::move(ops[n]);
    }
    std::vector<TensorSpec> specs;
    for (ValueId v : node.inputs) specs.push_back(value(v).spec);
    OpInfo info;
    try {
      info = node.op->infer(specs);
    } catch (const Error& e) {
      throw Error(fmt::format("graph node \"{}\": {}", node.name, e.message()), e.hint());
    }
    for (ParamSpec& p : info.params) p.dtype = policy_.param(p.group);
    for (ParamSpec& b : info.buffers) b.dtype = DType::f32;
    DTRAIN_CHECK(
        info.params.size() == node.params.size() && info.buffers.size() == node.buffers.size() &&
            info.outputs.size() == node.outputs.size(),
        "replace_ops: node {} changed its number of parameters, buffers or outputs", node.name);
    std::vector<Tie> ties;
    for (size_t i = 0; i < info.params.size(); ++i) {
      FlatEntry& e = params_[static_cast<size_t>(node.params[i])];
      if (e.node == static_cast<int>(n)) {
        e.spec = info.params[i];
      } else {
        ties.push_back({static_cast<int>(i), node.params[i]});
      }
    }
    check_ties(node.name, info, ties);
    for (size_t i = 0; i < info.buffers.size(); ++i)
      buffers_[static_cast<size_t>(node.buffers[i])].spec = info.buffers[i];
    for (size_t i = 0; i < info.outputs.size(); ++i)
      values_[static_cast<size_t>(node.outputs[i])].spec = info.outputs[i];
    node.info = std::move(info);
  }
}

void Graph::begin_block() {
  DTRAIN_CHECK(open_block_ < 0, "begin_block inside block {}", open_block_);
  open_block_ = blocks_++;
}

void Graph::end_block() {
  DTRAIN_CHECK(open_block_ >= 0, "end_block without begin_block");
  open_block_ = -1;
}

ValueId Graph::add1(const std::string& name, std::unique_ptr<Op> op,
                    const std::vector<ValueId>& inputs, const std::vector<Tie>& ties) {
  std::vector<ValueId> out = add(name, std::move(op), inputs, ties);
  DTRAIN_CHECK(out.size() == 1, "node {} has {} outputs", name, out.size());
  return out[0];
}

int Graph::param_index(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<int>(i);
  throw Error(fmt::format("graph: no parameter named \"{}\"", name));
}

int64_t Graph::num_params() const {
  int64_t n = 0;
  for (const FlatEntry& e : params_) n += e.spec.shape.numel();
  return n;
}

double Graph::forward_flops() const {
  double f = 0;
  for (const Node& n : nodes_) f += n.info.flops;
  return f;
}

size_t Graph::max_workspace_bytes(Device device) const {
  size_t w = 0;
  for (const Node& n : nodes_)
    w = std::max(w, device.is_cuda() ? n.info.cuda_workspace_bytes : n.info.workspace_bytes);
  return w;
}

}  // namespace dtrain::graph
