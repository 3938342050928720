// The optimizer interface: one fused step over a flat f32 parameter buffer and its
// gradient buffer (same layout), described by ParamSegments, with named flat state
// buffers (momentum; exp_avg, exp_avg_sq) laid out like the parameters. Host memory
// only; no LR schedule (the caller passes lr), no clipping, no loss-scale unscaling.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/options.h"
#include "optim/segments.h"

namespace dtrain::optim {

// The resumable part of an optimizer: the number of steps taken and each state buffer,
// f32 [total_elems], in the parameters' layout (padding between segments stays 0).
struct OptimizerState {
  int64_t step = 0;
  std::vector<std::pair<std::string, Tensor>> buffers;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // params, grads: f32 [total_elems] host. Updates params and the state in place for
  // every segment element; reads grads only. Step k (counted from 1) uses lr as given.
  void step(Tensor& params, const Tensor& grads, double lr);

  int64_t step_count() const { return step_; }
  // Views of the live buffers (not copies): write them out, or copy to keep a snapshot.
  OptimizerState state() const;
  // Copies a saved state in. A buffer set or size that does not match this optimizer
  // (a checkpoint of another optimizer or model) is a dtrain::Error.
  void load_state(const OptimizerState& saved);

  OptimizerName name() const { return options_.name; }
  const OptimizerOptions& options() const { return options_; }
  const std::vector<ParamSegment>& segments() const { return segments_; }
  int64_t total_elems() const { return total_; }

 protected:
  Optimizer(const OptimizerOptions& options, std::vector<ParamSegment> segments,
            int64_t total_elems, const std::vector<std::string>& state_names);
  // One step over all chunks; step_ already counts this step (1 on the first).
  virtual void update(float* params, const float* grads, double lr) = 0;

  float* state_data(size_t i) const { return buffers_[i].second.data<float>(); }
  const std::vector<SegmentChunk>& chunks() const { return chunks_; }
  float decay_of(const SegmentChunk& c) const;  // weight_decay, or 0 for a no_decay segment
  int64_t step_ = 0;

 private:
  OptimizerOptions options_;
  std::vector<ParamSegment> segments_;
  int64_t total_ = 0;
  std::vector<SegmentChunk> chunks_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
};

// Checks the options (dtrain::Error naming the optimizer.* key) and the segments
// (DTRAIN_CHECK), allocates zeroed state. For a ZeRO shard pass shard_segments(...) and
// the shard's size: the optimizer then steps views of the shard only.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          std::vector<ParamSegment> segments, int64_t total_elems);

}  // namespace dtrain::optim
