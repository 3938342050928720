// Fine-tuning controls: each parameter's learning-rate factor and weight decay from
// optimizer.freeze, optimizer.layer_decay and optimizer.groups, decided from the
// model's graph once, before the first step.
//
// A freeze pattern matches a parameter's name ("layer1.0.conv1.weight", as `dtrain
// ckpt inspect` lists them: torchvision's for ResNet) or one of its modules' (the
// name cut at a dot: "layer1", "layer1.0"), whole, with `*` for any run of characters
// (dots included) and `?` for one; or the names `dtrain ckpt export` writes for it
// (Hugging Face's "transformer.wte.weight" for dtrain's
// "transformer.word_embeddings.weight"), all of them where dtrain holds several
// reference tensors in one (BERT's query, key and value: patterns covering some but
// not all of them are exit 2). A frozen parameter keeps its value bit for bit: its
// gradient is zeroed as backward finishes it (graph::Executor::set_frozen), so the
// gradient norm, clipping, the overflow check and compression do not see it, as
// PyTorch's requires_grad_(False) leaves it out, and the optimizer passes it over (no
// update and no weight decay). Its buffers (batch-norm running statistics) still update
// in training mode, as PyTorch's do. Backward skips what only frozen parameters need
// (graph::Executor::set_frozen, graph::BackwardSet: no backward for frozen layers with
// nothing trainable before them, no weight gradient for a frozen linear, convolution or
// embedding), and `dtrain estimate` replays that. A frozen parameter holds no optimizer
// state (optim::drops_frozen_state: zero pages on the host; dropped at a resume, its
// steps counted anew); its gradient buffer is still held and its zeros exchanged.
//
// Layer decay (BEiT's and timm's rule): layer 0 holds what the model uses before its
// first block (patch or word embeddings, a ResNet's stem), layers 1..L its blocks
// (graph::Node::block, the blocks activation checkpointing recomputes), layer L + 1
// what comes after (the final norm and the head); a parameter belongs to the layer of
// its first use, so GPT-2's output layer, tied to the word embedding, is layer 0.
// Layer l's learning rate is optimizer.lr x d^(L + 1 - l), schedule included.
//
// Groups (PyTorch's parameter groups): optimizer.groups[i].params are patterns as
// freeze's; the first group whose patterns match a parameter decides it: its lr_scale
// multiplies the parameter's learning rate (after layer decay's factor) and its
// weight_decay replaces optimizer.weight_decay and no_decay for it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "graph/graph.h"
#include "optim/options.h"

namespace dtrain::runtime {

bool pattern_matches(std::string_view pattern, std::string_view name);

class ParamGroups {
 public:
  ParamGroups() = default;  // every parameter at factor 1
  // Throws Error (exit 2) naming optimizer.freeze[i] (optimizer.groups[i].params[j])
  // when a pattern matches no parameter, when every parameter would be frozen, or when
  // a group takes no parameter (earlier groups took all it matches).
  ParamGroups(const OptimizerOptions& options, const graph::Graph& graph, const std::string& arch);

  // The named parameter's learning-rate factor (1 without layer_decay), and whether
  // optimizer.freeze names it (false for a name not in the graph).
  double lr_scale(const std::string& name) const;
  bool frozen(const std::string& name) const;
  // optimizer.groups: the named parameter's weight decay, where its group sets one
  // (in place of optimizer.weight_decay and no_decay).
  std::optional<double> weight_decay(const std::string& name) const;
  // Whether a name `dtrain ckpt export` writes (a reference implementation's) belongs to
  // a frozen parameter.
  bool frozen_reference(const std::string& name) const { return frozen_exported_.count(name) > 0; }
  // Per graph parameter (param_layout() order): 1 where frozen.
  const std::vector<uint8_t>& frozen_mask() const { return frozen_; }
  bool any_frozen() const { return !frozen_list_.empty(); }
  const std::vector<std::string>& frozen_names() const { return frozen_list_; }  // layout order
  // What the run's log and `dtrain validate` say of the settings in use (none: empty).
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::unordered_map<std::string, double> scale_;  // frozen: 0
  std::unordered_map<std::string, double> decay_;  // optimizer.groups' weight_decay
  std::unordered_set<std::string> frozen_names_;
  std::vector<std::string> frozen_list_;
  std::unordered_set<std::string> frozen_exported_;
  std::vector<uint8_t> frozen_;
  std::vector<std::string> lines_;
};

// Layer of each graph parameter (param_layout() order) as layer decay counts them:
// 0 before the first block, b + 1 in block b, num_blocks() + 1 after the last.
std::vector<int> param_layers(const graph::Graph& graph);

}  // namespace dtrain::runtime
