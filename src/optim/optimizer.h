// The optimizer interface: one fused step over a flat f32 parameter buffer and its
// gradient buffer (same layout), described by ParamSegments, with named flat state
// buffers (momentum; exp_avg, exp_avg_sq) laid out like the parameters, all on one
// device (the CPU or a CUDA device). No LR schedule (the caller passes lr). The
// caller folds the loss-scale unscale and the clipping factor into one gradient
// multiplier (grad_scale), which the update applies as it reads each gradient, and
// may ask the same pass to write the compute-dtype copy of each parameter
// (ParamTarget): unscale, clip, update the master, write the half copy, in one pass
// per segment for SGD and AdamW (LAMB: its two passes, then the copy).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/options.h"
#include "optim/segments.h"

namespace dtrain::optim {

// The resumable part of an optimizer: the number of steps taken and each state buffer,
// f32 [total_elems], in the parameters' layout (padding between segments stays 0),
// on the optimizer's device.
struct OptimizerState {
  int64_t step = 0;
  std::vector<std::pair<std::string, Tensor>> buffers;
};

// Where one step writes the parameters, in one of two forms:
//  - flat defined: the f32 buffer in the segments' layout (an fp32 run's parameters,
//    or a half run's fp32 master weights). copies: empty, or one tensor per segment
//    (segments() order) of the segment's size, f32 / f16 / bf16, which receives the
//    updated value rounded to its dtype in the same pass.
//  - flat undefined: views holds, per segment, the parameter itself (f32, f16 or
//    bf16, the segment's size), read widened and written back rounded: half
//    parameters updated in place, with no master copy (precision.master_weights:
//    false). SGD and AdamW only (LAMB's norms want the flat buffer).
struct ParamTarget {
  Tensor flat;
  std::vector<Tensor> copies;
  std::vector<Tensor> views;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // grads: f32 [total_elems] on the optimizer's device, read as grads x grad_scale.
  // Updates the target's parameters and the state in place for every segment element;
  // reads grads only. Step k (counted from 1) uses lr as given.
  void step(const ParamTarget& target, const Tensor& grads, double lr, float grad_scale = 1.0f);
  // params: f32 [total_elems], the flat form without copies.
  void step(Tensor& params, const Tensor& grads, double lr) {
    step(ParamTarget{params, {}, {}}, grads, lr);
  }
  // Whether steps accept ParamTarget::views (false for LAMB).
  virtual bool steps_views() const { return true; }
  // Optimizers with per-segment norms (LAMB's trust ratio): when a segment is a shard's
  // piece of a tensor (ZeRO), `combine` receives this optimizer's per-segment sums
  // (sum p^2, sum u^2, segments() order) and replaces them with the whole tensors'
  // (the ranks' pieces added). Others ignore it.
  using SegmentSums = std::function<void(std::vector<double>& p2, std::vector<double>& u2)>;
  virtual void set_segment_sums(SegmentSums combine) { (void)combine; }

  int64_t step_count() const { return step_; }
  // optimizer.freeze: the steps each tensor was frozen for, by name (absent: 0), as the
  // trainer's checkpoints keep them; a segment frozen now counts every step so far (it
  // holds no state: load_state dropped what it had), and each frozen segment's count
  // grows by one per step from here on. AdamW's bias correction of a segment counts the
  // steps it was stepped, step_count() less these (PyTorch's per-parameter step), so a
  // tensor unfrozen at a resume starts as a fresh parameter does, at about lr per
  // element, not at (1 - b1) / sqrt(1 - b2) times it. LAMB runs its kernels once per
  // group of segments frozen for the same count (one bias correction each).
  void set_frozen_steps(const std::map<std::string, int64_t>& by_name);
  // optimizer.ema: the average's buffer (the last state buffer, "ema": f32 [total_elems],
  // in the parameters' layout), or undefined without one. Ready: it holds an average.
  // False at construction; start_ema() or a step sets it, load_state() too (the caller
  // clears it, set_ema_ready(false), when the state it loaded had no average, and the
  // next start_ema() or step starts one from the weights).
  bool has_ema() const { return options_.ema.decay.has_value(); }
  Tensor ema() const { return has_ema() ? buffers_.back().second : Tensor(); }
  bool ema_ready() const { return ema_ready_; }
  void set_ema_ready(bool ready) { ema_ready_ = ready && has_ema(); }
  // Starts the average as `params` (f32 [total_elems] on the optimizer's device: what
  // step() updates): the trainer calls it once the weights are set (initialised,
  // model.init_from, or resumed from a checkpoint without an average), so that every
  // checkpoint holds a real average. step() starts it itself when it is not ready.
  void start_ema(const Tensor& params);
  // The decay of the average at step t (counted from 1), in double.
  double ema_decay_at(int64_t t) const;
  // Views of the live buffers (not copies): read them (write them out, or copy to keep
  // a snapshot); write them through load_state or load_state_piece only: a frozen
  // segment's range of the algorithm's buffers is read-only zeros on the CPU.
  OptimizerState state() const;
  // Copies a saved state in (from any device). A buffer set or size that does not match
  // this optimizer (a checkpoint of another optimizer or model) is a dtrain::Error. What
  // a frozen segment's range of the algorithm's buffers holds is not taken (a frozen
  // tensor has no optimizer state: it restarts as a fresh parameter when unfrozen,
  // set_frozen_steps); the average takes every segment.
  void load_state(const OptimizerState& saved);
  // The same for elements [at, at + piece.numel()) of state buffer `buffer` (state()
  // order): a checkpoint read a piece at a time.
  void load_state_piece(size_t buffer, int64_t at, const Tensor& piece);

  OptimizerName name() const { return options_.name; }
  const OptimizerOptions& options() const { return options_; }
  const std::vector<ParamSegment>& segments() const { return segments_; }
  int64_t total_elems() const { return total_; }
  Device device() const { return device_; }

 protected:
  Optimizer(const OptimizerOptions& options, std::vector<ParamSegment> segments,
            int64_t total_elems, const std::vector<std::string>& state_names, Device device);
  // One step; step_ already counts this step (1 on the first). The target is checked.
  virtual void update(const ParamTarget& target, const Tensor& grads, double lr,
                      float grad_scale) = 0;
  // The parameters of [at, at + n) (inside one segment) as the target holds them: a view
  // of the flat buffer, or of the segment's own tensor; and the copy's range, or nullptr.
  Tensor param_range(const ParamTarget& t, int32_t segment, int64_t at, int64_t n) const;
  Tensor copy_range(const ParamTarget& t, int32_t segment, int64_t at, int64_t n) const;

  Tensor state_buffer(size_t i) const { return buffers_[i].second; }
  const std::vector<SegmentChunk>& chunks() const { return chunks_; }
  // The segment's weight_decay (optimizer.groups), else the options' weight_decay, or 0
  // for a no_decay segment.
  float decay_of(int32_t segment) const;
  // fn(segment, begin, length) over ranges of the flat buffers that together cover
  // every segment once: on the CPU the fixed chunks, run on the thread pool; on CUDA
  // whole segments, one after another (each a kernel launch over the whole segment).
  void for_each_range(const std::function<void(int32_t, int64_t, int64_t)>& fn) const;
  int64_t step_ = 0;
  // Per segment: the steps it was frozen for (set_frozen_steps; empty: none).
  std::vector<int64_t> frozen_steps_;
  int64_t steps_of(int32_t segment) const {  // the steps this segment was stepped, this one in
    return frozen_steps_.empty() ? step_ : step_ - frozen_steps_[static_cast<size_t>(segment)];
  }

 private:
  OptimizerOptions options_;
  std::vector<ParamSegment> segments_;
  int64_t total_ = 0;
  Device device_;
  std::vector<SegmentChunk> chunks_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  bool ema_ready_ = false;
};

// The name of optimizer.ema's state buffer.
inline constexpr const char* kEmaBuffer = "ema";
// optimizer.freeze: the element ranges of the segments that hold optimizer state (every
// segment not frozen), and whether an optimizer on `device` commits memory for those
// alone: on the CPU, a frozen segment's range of each algorithm buffer (not the
// average's) is read-only zero pages (Tensor::held_pages, Unheld::zeros), so a linear
// probe keeps state for its head only. On CUDA the buffers are whole (zeros there).
std::vector<std::pair<int64_t, int64_t>> stateful_ranges(const std::vector<ParamSegment>& segments);
bool drops_frozen_state(const std::vector<ParamSegment>& segments, Device device);
// How many f32 state buffers of the parameters' size an optimizer with these options
// keeps (the EMA included): what dtrain estimate counts.
int state_buffer_count(const OptimizerOptions& options);

// Checks the options (dtrain::Error naming the optimizer.* key) and the segments
// (DTRAIN_CHECK), allocates zeroed state on `device`. For a ZeRO shard pass
// shard_segments(...) and the shard's size: the optimizer then steps views of the
// shard only.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          std::vector<ParamSegment> segments, int64_t total_elems,
                                          Device device = Device::cpu());

}  // namespace dtrain::optim
