// The precision stage of a training step (DESIGN.md, "stages, not branches"): which
// parameters the optimizer steps, where the f32 gradients it reads live, and what a
// checkpoint holds, for each precision layout, so the trainer never branches on it.
//  - fp32: the executor's own parameters and gradients.
//  - half with master weights (precision.master_weights: true, the default): fp32
//    masters in their own flat buffer, laid out as an fp32 run's parameters (same
//    names, same offsets), which is also the layout of the executor's f32 parameter
//    gradients (graph::Executor::grads()). One optimizer pass per segment reads the
//    gradient (unscaled and clipped by one multiplier), updates the master and writes
//    the half copy the model computes with.
//  - half without master weights (master_weights: false): the same f32 gradients,
//    and the executor's half parameters updated in place (rounded every step: small
//    updates are lost, which is why the job file has to ask for it).
// The f32 gradient buffer is what the data-parallel buckets, the accumulation over
// micro-batches, the overflow check and the norm read, whatever the precision.
// Checkpoints always hold f32 parameters in the fp32 layout (widened from the half
// parameters when there are no masters), so a checkpoint resumes in any precision.
// Offload (memory.offload.optimizer, for a GPU job): what the optimizer reads and
// writes lives in host memory (pinned with CUDA) instead: the masters (or, in fp32,
// the parameters' host twin), the optimizer state (the caller builds the optimizer on
// optimizer_device()), a host copy of the f32 gradients and a host twin of the
// executor's parameters in their own dtypes. step() downloads the gradients, runs the
// CPU backend's fused step (the same kernels as a CPU job, so the same bits) and
// uploads the parameters. The GPU keeps the parameters, the gradients and the
// activations only.
// ZeRO-1 (a ShardRange with world > 1): the optimizer steps only this rank's range of
// the fp32 layout (its state is that range's; runtime/zero.h). fp32: the executor's
// parameters in that range, then an all-gather of the parameter buffer. Masters:
// this rank's range of the masters alone; after the step they are gathered through
// the gradient buffer (spent by then) and published to the executor, so each rank
// rounds every half parameter itself from the same f32 value. A checkpoint is saved
// by shard (shard_params()) and read back piece by piece (load_piece()), from any
// layout's checkpoint.
// A pipeline stage (a ShardRange `staged` over its span, runtime/pipeline.h) steps its
// span as ZeRO-1 steps a shard: its masters and optimizer state are the span's, and
// the stepped range is rounded into its parameters (ZeRO-1 over its data ranks: its
// shard of the span, gathered over the span).
// ZeRO-2 (shard_grads given: f32 [shard size], kept by dist::ShardedGradSync): the
// executor holds no whole gradient buffer, grads() is this rank's shard of it, and
// the masters are passed around in pieces after the step (runtime::broadcast_shards).
// ZeRO-3 (shard_params given: this rank's range of the layout in the compute dtype,
// runtime/zero_params.h; the executor holds no parameters): fp32 steps that range in
// place (or its host twin when offloaded, copied back); masters step their range and
// round it into shard_params. Nothing is gathered after the step: the next forward
// gathers each block as it needs it.
// ZeRO-Offload (a shard and offload): this rank's range of the masters (in fp32 of the
// parameters), of the optimizer state and of the summed gradient live in host memory;
// the step downloads the gradient's range, steps on the host, and the stepped range
// goes back through the same gathers as above (the executor keeps whole parameters).
#pragma once

#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "graph/executor.h"
#include "optim/optimizer.h"
#include "runtime/zero.h"

namespace dtrain::runtime {

enum class MasterMode : uint8_t { fp32, masters, in_place };

class MasterWeights {
 public:
  // ex: initialised from `seed` already. masters are initialised from the same seed in
  // f32 (an fp32 run's values, unrounded) and published into the executor.
  MasterWeights(graph::Executor& ex, MasterMode mode, uint64_t seed, Device device,
                bool offload = false, ShardRange shard = {}, Tensor shard_grads = {},
                Tensor shard_params = {});
  // The data-parallel communicator the shards are gathered over (ZeRO; before step()).
  void attach(dist::Communicator& comm) { comm_ = &comm; }
  const ShardRange& shard() const { return shard_; }
  // ZeRO: this rank's range of the fp32-layout parameters (its masters, or in fp32 the
  // executor's own), what its checkpoint shard holds.
  Tensor shard_params() const;

  MasterMode mode() const { return mode_; }
  bool offloaded() const { return offload_; }
  // Where the optimizer and its state belong: the host when offloaded, else the device.
  Device optimizer_device() const { return offload_ ? Device::cpu() : device_; }
  // The fp32 layout of the gradients, the optimizer state and the checkpoint.
  const std::vector<graph::FlatEntry>& layout() const { return layout_.entries(); }
  // f32, in layout(): the executor's (ZeRO-2: this rank's shard of it)
  Tensor grads() const { return grads_; }
  // ZeRO-2: each rank holds only its shard of the gradient; the pieces of the masters
  // travel in pieces of this many elements after each step.
  void set_gather_piece(int64_t elems) { gather_piece_ = elems; }
  // optimizer.freeze under ZeRO: the parts of the layout a step changes (the gradient
  // buckets' cover, runtime::bucket_cover); each step gathers those alone (gather_cover,
  // or broadcast_shards of them), the frozen rest being equal on every rank already.
  // Empty (the default): the whole span.
  void set_cover(LayoutRanges cover) { cover_ = std::move(cover); }
  // Where the optimizer writes (built once; the views stay valid).
  const optim::ParamTarget& target() const { return target_; }
  // One update: opt (built on optimizer_device()) reads grads() x grad_scale and
  // updates target(); offloaded, the gradients go to the host first and the
  // parameters come back after.
  void step(optim::Optimizer& opt, double lr, float grad_scale);
  // Evaluating optimizer.ema's average: exchanges the values of what the optimizer
  // steps (target().flat: the fp32 weights or masters, this rank's range of them under
  // ZeRO or in a pipeline stage) with `values` (f32, the same size and device), then
  // gives the executor the new ones as a step does (rounded into the compute dtype,
  // gathered over the data group: collective). A second call with the same `values`
  // restores every bit. Not for in_place (precision.master_weights false).
  void exchange(Tensor& values);

  // The parameters in the fp32 layout, ready to be saved or compared across ranks (for
  // in_place: widened now into a temporary, dropped by release_state(); not for
  // sharded masters, which are saved by shard).
  graph::FlatStore& state();
  // After state() was overwritten (tests): the executor gets the values.
  void state_loaded();
  // Resume (runtime/train_state.h, load_train_state_ranges): a piece [lo, lo + n) of
  // the fp32-layout parameters from a checkpoint (f32, host), kept where this layout
  // keeps them (masters, the shard of them, or the fp32 parameters) and rounded into
  // the executor's compute-dtype parameters; finish_load() after the last piece.
  void load_piece(int64_t lo, const Tensor& piece);
  void finish_load();
  void release_state() { wide_.reset(); }

 private:
  void publish(const Tensor& flat);  // f32 layout -> executor, rounded
  // ranged: the stepped range -> the executor (gathered), rounded; `whole`: every part of
  // it, not only the cover (optimizer.ema's average differs in the frozen parts too).
  void publish_range(bool whole = false);
  void upload();                                        // offloaded: host twin -> executor
  void publish_piece(int64_t lo, const Tensor& piece);  // f32 layout piece -> executor

  graph::Executor& ex_;
  MasterMode mode_;
  Device device_;
  bool offload_ = false;
  graph::FlatStore host_params_;  // offloaded: the executor's parameters, in host memory
  Tensor host_grads_;             // offloaded: f32 gradients, in host memory
  ShardRange shard_;
  Tensor shard_masters_;      // ZeRO with masters: this rank's range of them (host: offload)
  Tensor shard_host_params_;  // ZeRO-Offload in fp32: this rank's range, on the host
  Tensor param_shard_;        // ZeRO-3: the parameters' range, in the compute dtype
  bool twin_ = false;         // offload without ZeRO: host_params_ twins the executor's
  dist::Communicator* comm_ = nullptr;
  bool grads_sharded_ = false;              // ZeRO-2: grads_ is the shard
  int64_t gather_piece_ = 1 << 22;          // ZeRO-2: elements per broadcast piece
  LayoutRanges cover_;                      // set_cover (empty: the whole span)
  graph::FlatStore layout_;                 // masters (allocated) or the layout alone
  std::unique_ptr<graph::FlatStore> wide_;  // in_place: the widened checkpoint copy
  Tensor grads_;
  optim::ParamTarget target_;
};

}  // namespace dtrain::runtime
