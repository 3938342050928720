// The op contract. An op (a layer) declares, through infer(), everything the
// executor, the memory planner and `dtrain estimate` need — output shapes,
// parameters (name, shape, init), saved tensors, workspace bytes, FLOPs —
// without allocating anything. forward() and backward() check their
// arguments, then call the op's implementation, which lives in one file per
// op family with backward right under forward (src/graph/ops/*.cpp).
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/tensor_share.h"
#include "kernels/common.h"

namespace dtrain::graph {

struct TensorSpec {
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const TensorSpec&) const = default;
};

enum class InitKind : uint8_t {
  zeros,
  ones,
  normal,           // N(0, scale^2)
  uniform,          // U(-scale, scale)
  kaiming_normal,   // N(0, 2 / fan_in): ReLU networks
  kaiming_uniform,  // U(-b, b), b = sqrt(1 / fan_in): PyTorch's Linear/Conv default
};

// Which parameters take weight decay etc. is decided by group, never by index.
enum class ParamGroup : uint8_t { weight, bias, norm, embedding };

struct ParamSpec {
  std::string name;  // local to the op; the graph prefixes the op name ("block1.conv.weight")
  Shape shape;
  InitKind init = InitKind::zeros;
  double scale = 0.0;  // for normal / uniform
  int64_t fan_in = 1;  // for kaiming_*
  ParamGroup group = ParamGroup::weight;
  DType dtype = DType::f32;  // parameters: set by the graph's DTypePolicy; buffers: f32
  // Tensor parallelism: `shape` is this rank's part of the whole tensor, cut so;
  // initialisation draws each element as the whole tensor's (graph/params.h).
  ParamSplit split = {};
};

// The dtype policy of a whole graph (precision.dtype), decided here and nowhere
// else: parameters and activations are stored in `compute` (f32, f16 or bf16),
// except normalisation parameters (batch- and layer-norm gamma / beta), which
// are f32 whatever `compute` is: they are few, they scale every activation, and
// cuDNN's batch norm wants them f32 for half data anyway. Running statistics
// (buffers), batch- and layer-norm statistics, softmax's log-sum-exp and the
// loss are f32; GEMMs and convolutions accumulate in f32 (the kernels' contract).
// Activation gradients take the activation's dtype; parameter gradients are kept
// in f32 (graph::Executor::grads(): summed over micro-batches and ranks, read by the
// fp32 optimizer), each op's half weight gradient widened as the op finishes (or
// written in f32 by the op itself: Op::param_grad_in_f32).
struct DTypePolicy {
  DType compute = DType::f32;
  DType param(ParamGroup g) const { return g == ParamGroup::norm ? DType::f32 : compute; }
  bool half() const { return compute != DType::f32; }
};

// What backward needs kept from forward, beyond the op's parameters.
enum class Keep : uint8_t { nothing, inputs, outputs, inputs_and_outputs };

struct OpInfo {
  std::vector<TensorSpec> outputs;
  std::vector<ParamSpec> params;
  std::vector<ParamSpec> buffers;  // non-trainable state kept across steps (BN running stats)
  std::vector<TensorSpec> saved;   // extra tensors forward writes for backward (stats, masks, lse)
  Keep keep = Keep::inputs;
  // Allocated by backward itself and freed before it returns (the memory planner
  // counts them): linear_gelu's gradient at the pre-activation.
  std::vector<TensorSpec> backward_temps;
  // Backward writes the input gradient even when the input takes none (into a
  // temporary of the input's spec): the norms' kernels always produce dx.
  bool writes_input_grad = false;
  // Backward may write grad_inputs[k] over inputs[k] (an element-wise gradient that
  // reads each input element before writing it): the executor then hands it the
  // input's own buffer when nothing reads that value afterwards. -1: never.
  int grad_in_place = -1;
  // Allocated by a recompute forward (OpContext::recompute) and freed before it returns:
  // batch norm's throwaway running statistics.
  std::vector<TensorSpec> recompute_temps;
  size_t workspace_bytes = 0;       // max of forward and backward, on the CPU
  size_t cuda_workspace_bytes = 0;  // the same on a CUDA device (its kernels differ)
  double flops = 0.0;               // forward FLOPs for the whole batch
};

enum class Mode : uint8_t { train, eval };

// Whether an op has a channel-blocked form on the CPU (graph/layouts.h): none; alike
// (its 4-D inputs and outputs all blocked or all plain: batch norm, pooling, ReLU, add);
// free (each input and output on its own: a convolution with groups 1 and no bias);
// reads (a blocked input, a plain output: global average pooling).
enum class BlockedForm : uint8_t { none, alike, free, reads };

// Which samples of the step's global batch this batch holds: samples [first, first +
// count), batch-major in every tensor (sample b owns the b-th 1/count of each
// activation). Random draws are keyed by the sample, not by the rank or micro-batch
// that computes it, so a step's result does not depend on how its batch is split.
struct BatchKey {
  uint64_t first = 0;
  int64_t count = 1;
  // Stream words of the samples before this batch, for a tensor of `numel` elements.
  uint64_t word_offset(int64_t numel) const {
    return first * static_cast<uint64_t>(numel / std::max<int64_t>(count, 1));
  }
};

// Everything one op call sees. Spans are in the op's declared order.
struct OpContext {
  Mode mode = Mode::train;
  uint64_t seed = 0;  // run seed, for ops that draw random numbers
  uint64_t step = 0;  // training step, so each step draws fresh numbers
  uint32_t op_index = 0;
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;
  std::span<Tensor> params;
  std::span<Tensor> buffers;
  std::span<Tensor> saved;
  kernels::Workspace workspace;
  // Backward only. grad_inputs[i] is undefined when input i needs no
  // gradient (labels, graph inputs); otherwise it is fully overwritten.
  std::span<const Tensor> grad_outputs;
  std::span<Tensor> grad_inputs;
  // Overwritten, same order as params (undefined: frozen, not wanted; only where
  // Op::skips_param_grad(k))...
  std::span<Tensor> grad_params;
  // ...except where bit k is set: then add into grad_params[k] (a tied parameter's
  // later user, for an op whose can_accumulate_param_grad(k) is true; a half param's
  // f32 gradient where param_grad_in_f32(k), which implies it).
  uint32_t accumulate_mask = 0;
  bool accumulates(size_t k) const { return (accumulate_mask >> k) & 1u; }
  kernels::MathMode math = kernels::MathMode::fp32;  // f32 GEMMs / convolutions (precision.tf32)
  BatchKey batch;
  // How inputs[k] and outputs[k] (and their gradients) lie in memory: 0 plain, B
  // channel-blocked (graph/layouts.h; only the ops with a blocked form see a B). Empty:
  // all plain.
  std::span<const int32_t> input_blocks, output_blocks;
  int64_t input_block(size_t k) const { return k < input_blocks.size() ? input_blocks[k] : 0; }
  int64_t output_block(size_t k) const { return k < output_blocks.size() ? output_blocks[k] : 0; }
  // Forward again for activation checkpointing (graph/lifetimes.h): the outputs and
  // saved tensors must be the first forward's bits, and state that forward updated
  // (batch norm's running statistics) must not be updated twice.
  bool recompute = false;
};

class Op {
 public:
  virtual ~Op() = default;
  virtual std::string_view kind() const = 0;

  // The graph's policy, bound by Graph::add before infer(): ops that create a
  // floating value from nothing (embeddings, casts) take its compute dtype.
  void bind_policy(const DTypePolicy& policy) { policy_ = policy; }

  // Checks the input specs (throws Error naming the op and shapes on misuse).
  OpInfo infer(std::span<const TensorSpec> inputs) const;
  void forward(OpContext& ctx) const;
  void backward(OpContext& ctx) const;
  // Whether backward can add param k's gradient into what is there rather than
  // overwrite it. For a tied parameter this spares a temporary of the parameter's
  // size and a pass to add it in (an embedding table tied to an output layer).
  virtual bool can_accumulate_param_grad(size_t /*k*/) const { return false; }
  // Whether backward can write (or, as above, add into) a half param k's gradient in
  // f32: the executor then hands it the f32 gradient itself, with no half temporary to
  // widen after (a half word table: its gradient a scatter-add of half rows). Implies
  // can_accumulate_param_grad(k).
  virtual bool param_grad_in_f32(size_t /*k*/) const { return false; }
  // Whether backward accepts an undefined grad_params[k] and then computes nothing for
  // param k (a frozen parameter: Executor::set_frozen), so that a frozen layer still
  // passing its input's gradient down skips its weight-gradient GEMM.
  virtual bool skips_param_grad(size_t /*k*/) const { return false; }
  // What backward still reads (OpInfo::keep is `keep`) when it computes no gradient for
  // the parameters whose bits are set in `skipped` (those Op::skips_param_grad allows):
  // a linear's or a convolution's input is read by its weight gradient alone, so a
  // frozen one behind a trained layer keeps none of it.
  virtual Keep keep_skipping(Keep keep, uint32_t /*skipped*/) const { return keep; }
  // Tensor parallelism (graph/tensor_parallel.h): the op computing one rank's part
  // in `share`'s role, or null when it has no such form.
  virtual std::unique_ptr<Op> tensor_share(const TpShare& /*share*/) const { return nullptr; }
  // Its channel-blocked form, if any (graph/layouts.h); OpContext::input_block and
  // output_block then say which operands are blocked.
  virtual BlockedForm blocked_form() const { return BlockedForm::none; }

 protected:
  virtual OpInfo do_infer(std::span<const TensorSpec> inputs) const = 0;
  virtual void do_forward(OpContext& ctx) const = 0;
  virtual void do_backward(OpContext& ctx) const = 0;
  virtual int num_inputs() const { return 1; }
  const DTypePolicy& policy() const { return policy_; }

 private:
  DTypePolicy policy_;
};

// Whether `op` writes its half (`dtype` not f32) param k's gradient in f32 itself
// (Op::param_grad_in_f32): the executor hands it the f32 gradient, and the memory
// planner counts no half temporary and no widening for it.
inline bool half_grad_in_f32(const Op& op, size_t k, DType dtype) {
  return dtype != DType::f32 && k < 32 && op.param_grad_in_f32(k);
}

// Throws an Error "op <kind>: <message>" (a graph-construction error the user can fix).
[[noreturn]] void op_error(std::string_view kind, const std::string& message);

}  // namespace dtrain::graph
