// ZeRO-2's gradients: no whole gradient buffer. Backward writes each parameter's f32
// gradient into its bucket (the DDP buckets of dist/ddp.h: contiguous ranges of the
// fp32 layout cut from its end), a buffer allocated when the bucket's first gradient
// is written (zero-filled: the padding between tensors stays 0). The moment a bucket's
// last gradient is ready, each part of it that a rank owns is summed into that rank
// (Communicator::reduce, one call per owning rank), the owner adds its part into its
// shard of the gradient, and the bucket's buffer is freed. What stays is this rank's
// shard, [begin, end) of the layout: the first micro-batch of a step writes it, later
// ones add to it (each micro-batch is reduced: the sums over ranks and micro-batches
// run in another order than plain data parallelism's, equal with two ranks and one
// micro-batch each). Sums only, like GradSync.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/ddp.h"

namespace dtrain::dist {

class ShardedGradSync : public StepGradients {
 public:
  // params: every parameter's range of the layout (increasing offsets); ranges: every
  // rank's [begin, end) of it (tiling it, rank order); shard: f32 [this rank's size].
  // Unbucketed::skipped: a parameter in no bucket (optimizer.freeze) has no gradient
  // storage (grad_view refuses it), its readiness is ignored, and its part of the shard
  // stays zero.
  ShardedGradSync(Communicator& comm, std::vector<Bucket> buckets,
                  const std::vector<GradRange>& params,
                  std::vector<std::pair<int64_t, int64_t>> ranges, Tensor shard,
                  Unbucketed unbucketed = Unbucketed::refused);

  const std::vector<Bucket>& buckets() const override { return buckets_; }
  std::string exchange(size_t) const override { return "reduce(owners)"; }
  // The profiler's view: each bucket's reduces, reported as the bucket is reduced.
  void set_trace(TraceFn trace) override { trace_ = std::move(trace); }
  // Where parameter p's gradient is written (the executor's grad storage).
  Tensor grad_view(int param, const Shape& shape);
  // Before each micro-batch's backward: the first of a step overwrites the shard.
  void begin_micro(bool first);
  void ready(int param) override;  // the executor's grad_ready hook
  // After each micro-batch's backward: every bucket was reduced (a parameter the loss
  // does not reach still gets its zeros written and reported ready by the executor).
  void end_micro();
  // StepGradients: every micro-batch is reduced into the shard as its backward runs.
  void before_backward(int micro, int) override { begin_micro(micro == 0); }
  void after_backward(int, int) override { end_micro(); }
  void finish() override {}
  SyncStats take_stats() override;

 private:
  void reduce(size_t b);

  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<GradRange> params_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  Tensor shard_;
  std::vector<int> bucket_of_;  // per param
  std::vector<int> pending_;    // per bucket
  std::vector<Tensor> buffers_;
  bool first_ = true;
  TraceFn trace_;
  SyncStats stats_;
  CommStats comm_mark_;
};

}  // namespace dtrain::dist
