// Runs a graph: forward over a batch, then backward from the scalar loss.
// Hooks let distribution attach from outside: pre_op fires before every op
// (ZeRO-3 gather, pipeline receive) and grad_ready fires for each parameter
// the moment its gradient is final (DDP buckets, ZeRO reduce-scatter). A tied
// parameter (several nodes use it) gets the sum of its users' gradients: the
// first user in backward order overwrites, later ones add theirs directly when
// their op can accumulate (Op::can_accumulate_param_grad: an embedding's
// scatter-add), else through a temporary; grad_ready fires once, after the last
// contribution.
// Values are released after their last use (graph/lifetimes.h): a forward value
// as soon as no later op reads it and no backward asked to keep it (OpInfo::keep),
// a kept one after the backward that needed it; an evaluation keeps no saved
// tensors. The loss (any value nothing reads) and values pinned with keep() stay
// readable until the next forward. A backward that declared it does not keep a
// value gets Tensor::meta (shape and dtype, no memory) in its place.
// Pipeline stages (graph/stages.h): set_range limits forward and backward to a stage's
// nodes; set_value supplies what earlier stages made, backward(seeds, ...) starts from
// the gradients later stages sent back, and take_grad hands over the gradients of the
// received values. Several micro-batches can be in flight (set_slots / select_slot:
// each slot holds one micro-batch's values, saved tensors and batch key), as the
// GPipe and 1F1B schedules need. Lifetimes stay the whole graph's: a stage runs a
// subset of its steps in the same order, so every release and in-place gradient is
// the one-rank run's, and the arithmetic (sums included) is bit for bit the same.
// Everything lives on the executor's device: parameters, gradients, buffers,
// activations (plain allocations from that device's caching pool for now; the memory
// planner replaces that without changing this API) and the shared workspace. Inputs
// must already be there (set_input refuses a tensor on another device: copies are the
// caller's, explicit). On CUDA every op is enqueued on the device's stream, so
// forward() and backward() return before the device has finished.
#pragma once

#include <functional>
#include <vector>

#include "graph/graph.h"
#include "graph/lifetimes.h"

namespace dtrain::graph {

// recompute: a checkpointed segment's forward again, run inside backward.
enum class Phase : uint8_t { forward, backward, recompute };

struct Hooks {
  std::function<void(int node, Phase phase)> pre_op;
  // After the node's work is issued (on CUDA: enqueued, not necessarily finished): the
  // profiler's span end. Not called for a backward node the loss does not reach.
  std::function<void(int node, Phase phase)> post_op;
  std::function<void(int param)> grad_ready;  // index into params()
};

// Where parameter gradients live: the executor's own flat buffer (grads()), or storage
// a caller provides per parameter through set_grad_storage (ZeRO-2's buckets).
enum class GradBuffer : uint8_t { owned, external };
// Where parameters live: the executor's own flat buffer (params()), or views a caller
// provides per parameter through set_param_storage (ZeRO-3's gathered blocks; params()
// then holds the layout only, and initialize() sets the buffers alone).
enum class ParamBuffer : uint8_t { owned, external };

class Executor {
 public:
  // `stage`: nodes [first, second) only (a pipeline stage's; second -1: every node), as
  // set_range, and the owned parameter and gradient buffers hold the parameters those
  // nodes use and no others (FlatStore::allocate_held: the host, addressed as the whole
  // model). set_range can then only narrow to nodes using held parameters.
  // `zero_grads` (per parameter, 1 where set; empty: none; the whole graph): gradients
  // never written nor handed out (grad_view): frozen parameters whose gradients no
  // exchange sends (optimizer.freeze; set_frozen must name them). With owned gradients
  // (the host only) they are read-only zero pages that commit no memory
  // (FlatStore::allocate_held, Unheld::zeros); with external ones (ZeRO-2's buckets)
  // they have no storage at all. An op that cannot skip a frozen weight's gradient
  // writes it into a transient tensor.
  explicit Executor(const Graph& graph, Device device = Device::cpu(),
                    GradBuffer grad_buffer = GradBuffer::owned,
                    ParamBuffer param_buffer = ParamBuffer::owned,
                    std::pair<int, int> stage = {0, -1}, std::vector<char> zero_grads = {});

  Device device() const { return device_; }
  FlatStore& params() { return params_; }
  // Parameter gradients are f32 whatever the parameters' dtype (the layout of an fp32
  // run): an op with half parameters writes its weight gradient in half into a
  // transient tensor, which is widened into grads() as the op finishes (summed in f32
  // over a tied parameter's users), or, where Op::param_grad_in_f32 (a half word
  // table), writes into grads() itself. Half runs thus keep no half gradient buffer, and
  // grads() is what the optimizer of their fp32 master weights reads.
  FlatStore& grads() { return grads_; }  // unallocated with GradBuffer::external
  // With GradBuffer::external: where parameter p's f32 gradient is written (asked the
  // first time backward writes it in each pass; the view must stay valid until
  // grad_ready(p) and hold nothing meaningful before: the first writer overwrites it).
  void set_grad_storage(std::function<Tensor(int param)> storage) {
    grad_storage_ = std::move(storage);
  }
  Tensor grad_view(int param);  // parameter `param`'s gradient, wherever it lives
  // With ParamBuffer::external: parameter p's values for the op about to run (asked
  // after the pre_op hook of each node that uses it; valid until that node finished).
  void set_param_storage(std::function<Tensor(int param)> storage) {
    param_storage_ = std::move(storage);
  }
  Tensor param_view(int param) const;
  FlatStore& buffers() { return buffers_; }
  // Per parameter (params() order), 1 where its gradient is zeroed as backward finishes
  // it, before grad_ready (optimizer.freeze: runtime/param_groups.h). Empty: none.
  // Backward then skips what only frozen parameters need, as autograd does for tensors
  // without requires_grad (graph::BackwardSet):
  //  - an op that can (Op::skips_param_grad) computes no gradient for a frozen
  //    parameter (a frozen output layer's weight-gradient GEMM);
  //  - a node with no trainable parameter of its own and none upstream runs no backward
  //    and keeps nothing for it: its saved tensors go after its forward, and its inputs
  //    and outputs live only as long as forward and working nodes read them (a frozen
  //    backbone holds no activations for backward); a checkpointed segment of such
  //    nodes is not recomputed;
  //  - no gradient is computed for, or flows into, the values such nodes made.
  // The trainable parameters' gradients are the same bits either way. The last two only
  // where the executor runs the whole graph on parameters it owns: a pipeline stage
  // sends its input's gradient whatever it holds, and ZeRO-3's gathers follow a fixed
  // per-node schedule.
  void set_frozen(std::vector<uint8_t> frozen);
  // What set_frozen's skipping applies here (works and needs empty where this executor
  // does not prune): runtime::train_flops counts from it.
  BackwardSet backward_set() const;
  // Whether parameter p's gradient is written (not one of the constructor's zero_grads).
  bool writes_grad(int p) const { return !zero_grad(p); }
  // Parameters (when owned) and buffers, deterministically from the seed.
  void initialize(uint64_t seed);
  // How ops compute f32 GEMMs and convolutions (tf32: TF32 tensor cores on CUDA, the
  // job's precision.tf32; no effect on the CPU). Default fp32.
  void set_math(kernels::MathMode math) { math_ = math; }
  // Activation checkpointing (graph/lifetimes.h): segments of k consecutive model
  // blocks are recomputed in backward; 0 (the default) keeps every activation. `cuts`:
  // blocks where segments start afresh (the pipeline stages' first blocks).
  void set_checkpointing(int blocks_per_segment, std::vector<int> cuts = {});

  // The channel block of the activations the CPU ops with a blocked form pass among
  // themselves (graph/layouts.h): kernels::cpu_channel_block() by default on the CPU
  // (the only other choice: 0, all NCHW), 0 on CUDA. The same bits either way.
  void set_channel_block(int64_t block);
  // Per value: its channel block as the next forward will take it, 0 when plain. The
  // layouts are taken at the start of each forward and hold until its backward ends
  // (keep, set_range or set_channel_block in between change the next step's). A value
  // read without keep() may lie blocked.
  std::vector<int32_t> value_blocks() const;

  void set_input(ValueId v, Tensor t);  // shape, dtype and device must match the graph input

  // Pipeline stages. Runs nodes [begin, end) only (default: all). With activation
  // checkpointing, no segment may straddle `begin` or `end` (set_checkpointing's cuts). Parameters
  // no node of the range uses get no gradient (grads() keeps what it held there).
  void set_range(int begin, int end);
  int range_begin() const { return begin_; }
  int range_end() const { return end_; }
  // Micro-batches held at once (1 by default); select_slot(k) makes slot k's values,
  // saved tensors and batch key the current ones (forward, backward, value read them).
  void set_slots(int n);
  void select_slot(int k);
  // A value made before the range (a node of an earlier stage): this micro-batch's.
  void set_value(ValueId v, Tensor t);
  // After a forward over the range (and the sends): drops the values no remaining step
  // of this range reads (what only later stages needed).
  void release_unused();
  // `batch`: which samples of the step's global batch the inputs hold (BatchKey).
  void forward(Mode mode, uint64_t step = 0, BatchKey batch = {});
  const Tensor& value(ValueId v) const;
  // Keeps value v readable after the step (released only by the next forward), in
  // both modes or only in `mode` (the trainer reads the logits after an evaluation).
  void keep(ValueId v);
  void keep(ValueId v, Mode mode);
  // Backward from scalar `loss` with d loss = `dloss` (1: the gradient of the loss;
  // the trainer passes the batch's label count to get a sum over labels). Overwrites
  // every parameter gradient.
  void backward(ValueId loss, float dloss = 1.0f);
  // Backward over the range from `seeds`, the gradients of values later stages read
  // (taken over: later contributions are added into them), and from `loss` when it is
  // in the range (-1: none). Afterwards take_grad(v) hands over the gradient of each
  // received value (undefined when no node reached it), and the micro-batch's values
  // are released.
  void backward(const std::vector<std::pair<ValueId, Tensor>>& seeds, ValueId loss, float dloss);
  Tensor take_grad(ValueId v);

  Hooks hooks;

 private:
  std::function<Tensor(int)> grad_storage_;
  std::function<Tensor(int)> param_storage_;
  bool params_owned_ = true;
  std::vector<Tensor> param_views(const std::vector<int>& ids) const;
  void backward_node(int index, std::vector<Tensor>& vgrad);
  void recompute(const Lifetimes& life, const Segment& segment);
  bool in_place_grad(const Lifetimes& life, const Node& n, size_t k, int step) const;
  void run_forward(int index, bool recompute);
  // The gradient tensors node `index` writes: the param's own (f32) view for its first
  // user in backward order, and for a later user that can accumulate (its bit set in
  // `accumulate`), a half param's too where the op writes it in f32
  // (Op::param_grad_in_f32); else a fresh temporary, added in afterwards.
  std::vector<Tensor> grad_targets(const Node& n, int index, uint32_t& accumulate);

  void backward_range(std::vector<Tensor>& vgrad);
  void user_ranges();  // first_user_ / last_user_ over the range
  Tensor alloc(const TensorSpec& s) const;
  const Lifetimes& lifetimes(Mode mode);
  // ctx's input_blocks / output_blocks for node n (storage in `store`), from blocks_.
  void bind_blocks(const Node& n, OpContext& ctx, std::vector<int32_t>& store) const;
  void release_after(const Lifetimes& life, int step);
  // value v, or a Tensor::meta of its spec when it was released
  Tensor value_or_meta(ValueId v) const;

  const Graph& graph_;
  Device device_;
  FlatStore params_, grads_, buffers_;
  std::vector<Tensor> values_;
  std::vector<char> pinned_[2];  // per Mode (train, eval), per value: keep() was called
  Lifetimes life_[2];            // per Mode (train, eval); recomputed when pins change
  bool life_stale_[2] = {true, true};
  int64_t channel_block_ = 0;
  std::vector<int32_t> blocks_;  // per value (graph/layouts.h), taken by forward()
  bool blocks_stale_ = true;
  int blocks_per_segment_ = 0;
  std::vector<int> cuts_;
  void check_segments();  // none straddles the range
  std::vector<std::vector<Tensor>> saved_;
  BackwardSet frozen_;  // set_frozen (works and needs always computed)
  // The constructor's zero_grads (also frozen_.scratch, for the memory plan).
  std::vector<char> zero_grads_;
  bool zero_grad(int p) const { return frozen_.scratch_grad(p); }
  bool prunes() const;            // set_frozen's works / needs apply to this executor
  std::vector<Tensor> in_grads_;  // per value: a received value's gradient (backward)
  int begin_ = 0, end_ = 0;       // the range of nodes run
  // The micro-batches not current: values_, saved_, in_grads_, batch_ swapped in and out.
  struct Slot {
    std::vector<Tensor> values;
    std::vector<std::vector<Tensor>> saved;
    std::vector<Tensor> in_grads;
    BatchKey batch;
  };
  std::vector<Slot> slots_{1};
  int slot_ = 0;
  // Per param: the highest and lowest node index using it (= first and last in backward).
  std::vector<int> first_user_, last_user_;
  Tensor workspace_;
  Mode mode_ = Mode::train;
  kernels::MathMode math_ = kernels::MathMode::fp32;
  uint64_t seed_ = 0, step_ = 0;
  BatchKey batch_;
};

}  // namespace dtrain::graph
