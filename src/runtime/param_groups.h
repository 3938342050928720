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
// steps counted anew), and its gradient stays home (gradient_buckets; zero pages on a
// CPU job's executor where nothing sends it: zero_gradients).
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

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dist/ddp.h"
#include "graph/graph.h"
#include "graph/stages.h"
#include "optim/options.h"
#include "optim/segments.h"
#include "runtime/job.h"

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

// The optimizer's segments of a flat layout, each with its weight-decay mode and its
// learning-rate factor and whether optimizer.freeze froze it.
std::vector<optim::ParamSegment> segments_of(const std::vector<graph::FlatEntry>& layout,
                                             NoDecayGroups rule, const ParamGroups& groups);

// The data-parallel gradient buckets (dist/ddp.h) as the trainer plans them and dtrain
// estimate replays them, over the f32 layout's parameters (`layout`, param_layout()
// order): every one (dist::plan_buckets, tiling the layout), or some
// (dist::plan_buckets_of): a pipeline stage's own (`stage`; null without a pipeline)
// and, unless `frozen_too` (buckets that hold whatever backward writes), none of the
// frozen ones, whose gradients are zeros on every rank: nothing to sum, as PyTorch's DDP
// leaves out what does not require a gradient. A run of frozen tensors of at most
// kBridgeBytes between two trained ones still travels, so that freezing the norms of
// every layer does not cut each bucket at each of them (sending a megabyte of zeros
// costs less than another collective's latency). `all`: set to whether every
// parameter is in a bucket.
inline constexpr size_t kBridgeBytes = size_t{1} << 20;
std::vector<dist::Bucket> gradient_buckets(const std::vector<graph::FlatEntry>& layout,
                                           const graph::Graph& graph, const ParamGroups& groups,
                                           const graph::Stage* stage, bool frozen_too,
                                           size_t bucket_bytes, bool* all = nullptr);

// optimizer.freeze: per graph parameter, 1 where nothing writes its gradient
// (graph::Executor's zero_grads): frozen and in no bucket of gradient_buckets. Empty
// (none) but where the whole graph runs on one executor (not in a pipeline stage: its
// gradients are held pages already, and a tied weight's are summed across the cut) and
// either keeps a whole gradient buffer of its own on the host, whose frozen part is then
// read-only zero pages (a CPU job without ZeRO: ZeRO-1 gathers the stepped masters
// through the gradient buffer), or keeps none (ZeRO-2 and 3, on any device: a frozen
// gradient then has no bucket, and no buffer at all).
std::vector<char> zero_gradients(const Job& job, const graph::Graph& graph,
                                 const ParamGroups& groups);

// The parts of [lo, hi) that `buckets` cover, merged where they touch (increasing): what
// a ZeRO step changes, and so what it gathers, where not every parameter is in a bucket
// (the rest are frozen, equal on every rank).
std::vector<std::pair<int64_t, int64_t>> bucket_cover(const std::vector<dist::Bucket>& buckets,
                                                      int64_t lo, int64_t hi);

// Layer of each graph parameter (param_layout() order) as layer decay counts them:
// 0 before the first block, b + 1 in block b, num_blocks() + 1 after the last.
std::vector<int> param_layers(const graph::Graph& graph);

}  // namespace dtrain::runtime
