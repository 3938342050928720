// compress.method in a training run: the plan over GradSync's buckets (every rank
// plans the same buckets, so the same tensors compress everywhere), the Compressor
// hooked into GradSync, its state in checkpoints and its bookkeeping across loss-scale
// changes. The trainer holds one when compression is on; `dtrain validate` uses the
// plan and its byte count.
#pragma once

#include <string>
#include <vector>

#include "compress/compressor.h"
#include "graph/params.h"
#include "precision/loss_scaler.h"
#include "runtime/checkpoint.h"

namespace dtrain::runtime {

// The compressor's view of the parameter layout: offset, size and first dimension.
std::vector<compress::ParamInfo> compression_params(const std::vector<graph::FlatEntry>& layout);

// "topk on 12 of 40 parameter tensors": the plan in words, and what it sends.
struct CompressionPlanSummary {
  int compressed = 0, tensors = 0;
  compress::Tally per_step;  // bytes one rank sends per step, and the dense equivalent
  double ratio() const {
    return static_cast<double>(per_step.dense) /
           static_cast<double>(std::max<uint64_t>(per_step.sent, 1));
  }
};
CompressionPlanSummary summarize_plan(const CompressOptions& o,
                                      const std::vector<compress::BucketPlan>& plans, int tensors);

class GradCompression {
 public:
  // Plans `buckets` and routes them through the compressor (after the warm-up steps):
  // `grad_comm` carries the gradients, `device` holds them.
  GradCompression(const CompressOptions& o, const std::vector<graph::FlatEntry>& layout,
                  const std::vector<dist::Bucket>& buckets, dist::Communicator& grad_comm,
                  dist::GradSync& sync, int64_t layout_elems, AllreduceAlgo dense_algo,
                  uint64_t seed, Device device);

  // The start-up note: method, tensors, error feedback, warm-up, bytes per step.
  std::string describe() const;
  // Before step `step`'s backward: dense for compress.warmup_steps, compressed after.
  void begin_step(int64_t step);
  // The checkpoint's blobs: every rank's residual (they differ) and PowerSGD's Q (the
  // same on every rank). Single file (sharded false): "compress.residual" [world,
  // layout] gathered to rank 0 over `comm` (collective; the other ranks get nothing);
  // a ZeRO shard (sharded true): the rank's own row, and rank 0's shard the Q.
  std::vector<NamedTensor> state(dist::Communicator& comm, bool sharded) const;
  // After a resume: this rank's residual and the Q from `blobs` where they fit this
  // layout (rank `rank` of `world`); false when something was missing (error feedback
  // then starts empty).
  bool restore(const std::vector<NamedTensor>& blobs, int rank, int world);
  // The residual is kept in the scaled units of the gradients it came from: a new loss
  // scale rescales it, a skipped step (inf or nan in the gradients, hence in what the
  // residual took in) drops it.
  void adjust(const precision::ScaleDecision& d);
  compress::Tally take_tally() { return compressor_.take_tally(); }

 private:
  CompressOptions o_;
  dist::GradSync& sync_;
  compress::Compressor compressor_;
  CompressionPlanSummary summary_;
};

}  // namespace dtrain::runtime
