// A static graph of ops. Built once by a model builder; shapes are inferred
// as nodes are added, so every shape error surfaces at build time, naming the
// node. The graph owns its ops and the layout of parameters and buffers.
// Weight tying: a node may reuse a parameter of an earlier node instead of
// declaring its own (an LM head tied to the token embedding); the parameter is
// stored and counted once and the executor sums the gradients of its users.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/op.h"
#include "graph/params.h"

namespace dtrain::graph {

using ValueId = int32_t;

struct Value {
  std::string name;
  TensorSpec spec;
  int producer = -1;  // node index, -1 for graph inputs
  bool requires_grad = false;
};

// Node param `local` (index into the op's OpInfo::params) reuses graph param `param`.
struct Tie {
  int local = 0;
  int param = 0;
};

struct Node {
  std::string name;
  std::unique_ptr<Op> op;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  OpInfo info;
  std::vector<int> params;   // indices into the graph's parameter store layout (tied ones shared)
  std::vector<int> buffers;  // indices into the buffer layout
  int block = -1;            // the model block it belongs to (begin_block), or -1
};

class Graph {
 public:
  // Before the first node: the dtype policy every node follows (op.h: DTypePolicy).
  void set_policy(const DTypePolicy& policy);
  const DTypePolicy& policy() const { return policy_; }

  ValueId input(const std::string& name, const Shape& shape, DType dtype);
  // Adds a node; returns its output values. Throws Error naming the node on a
  // shape mismatch or a duplicate name.
  // A tied param must match the existing one in shape and dtype (Error naming both nodes).
  std::vector<ValueId> add(const std::string& name, std::unique_ptr<Op> op,
                           const std::vector<ValueId>& inputs, const std::vector<Tie>& ties = {});
  ValueId add1(const std::string& name, std::unique_ptr<Op> op, const std::vector<ValueId>& inputs,
               const std::vector<Tie>& ties = {});

  // A graph pass (graph/tensor_parallel.h): node i's op becomes ops[i] where that is
  // not null, and every node is inferred again in order, its parameters' and outputs'
  // specs following; names, edges and ties stay. Throws Error naming a node whose new
  // shapes do not fit (a tied parameter whose two users no longer agree).
  void replace_ops(std::vector<std::unique_ptr<Op>> ops);

  // Model builders mark their repeated blocks (a residual block, a transformer layer):
  // nodes added between begin_block and end_block carry the block's index. Activation
  // checkpointing recomputes whole blocks (graph/lifetimes.h: segments).
  void begin_block();
  void end_block();
  int num_blocks() const { return blocks_; }

  const std::vector<Node>& nodes() const { return nodes_; }
  const Value& value(ValueId v) const;
  int num_values() const { return static_cast<int>(values_.size()); }
  const std::vector<FlatEntry>& param_layout() const { return params_; }
  const std::vector<FlatEntry>& buffer_layout() const { return buffers_; }
  int param_index(const std::string& name) const;  // throws Error naming a missing parameter
  int64_t num_params() const;                      // a tied parameter counts once
  double forward_flops() const;                    // for the whole batch the graph was built for
  size_t max_workspace_bytes(Device device = Device::cpu()) const;

 private:
  void check_ties(const std::string& name, const OpInfo& info, const std::vector<Tie>& ties) const;

  DTypePolicy policy_;
  int blocks_ = 0;
  int open_block_ = -1;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<FlatEntry> params_;
  std::vector<FlatEntry> buffers_;
};

}  // namespace dtrain::graph
