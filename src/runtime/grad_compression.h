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
#include "runtime/param_groups.h"

namespace dtrain::runtime {

// The compressor's view of the parameter layout: offset, size and first dimension (0:
// stays dense). In a tensor-split layout the replicated entries stay dense: a bucket's
// top-k selection and 1-bit chunks span its tensors, and the split ones differ from
// tensor rank to tensor rank, so compressing a replicated entry with them would make
// its update differ too (the save's replica check stops such a run). Parameters
// optimizer.freeze froze (`groups`) stay dense as well: their gradients are zeros, which
// a 1-bit chunk shared with a trained tensor would turn into +-scale (and the residual
// keep).
std::vector<compress::ParamInfo> compression_params(const std::vector<graph::FlatEntry>& layout,
                                                    const ParamGroups& groups);

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
                                      const std::vector<compress::BucketPlan>& plans, int tensors,
                                      int data_ranks);

// Where compress.exchange gather moves more bytes per rank (`bus`) than the dense
// all-reduce it replaces (`dense`, the same units) on `data_ranks`: the sentence saying
// so and what to do; empty where it does not (and for PowerSGD). dtrain estimate's
// caveat and gather_warning say it in these words.
std::string gather_note(const CompressOptions& o, int data_ranks, double bus, double dense);

// Top-k and 1-bit with compress.exchange gather all-gather every rank's compressed
// gradient: past some number of data ranks the exchange moves more bytes per rank than
// the dense all-reduce it replaces. The warning then ("warning: on N data ranks onebit
// moves 16.5x the bytes per rank ...", gather_note), else empty. `zero1`: both followed by ZeRO-1's
// gather of the stepped parameters, as dtrain estimate counts. The start-up note and `dtrain
// validate` print it.
std::string gather_warning(const CompressOptions& o, const std::vector<compress::BucketPlan>& plans,
                           int data_ranks, bool zero1);

// Where compress.exchange auto took two_phase for top-k or 1-bit on `data_ranks`
// (compress::gather_share over a quarter): the note saying so, what it costs and how to
// keep one compression; empty otherwise (gather, two_phase named, PowerSGD). The
// start-up line and `dtrain validate` print it.
std::string two_phase_note(const CompressOptions& o, int data_ranks);

class GradCompression {
 public:
  // Plans `buckets` and routes them through the compressor (after the warm-up steps):
  // `grad_comm` carries the gradients, `device` holds them.
  // `place`: the rank's place in the grid, {pipeline, data, tensor degrees, its stage,
  // data rank, tensor rank}: a checkpoint's residual is restored only where it was made
  // (and by the same method, in the same form: the tag adds both; with frozen tensors,
  // `groups`, which compression_params leaves dense, the compressed pieces too).
  GradCompression(const CompressOptions& o, const ParamGroups& groups,
                  const std::vector<graph::FlatEntry>& layout,
                  const std::vector<dist::Bucket>& buckets, dist::Communicator& grad_comm,
                  dist::GradSync& sync, int64_t layout_elems, AllreduceAlgo dense_algo,
                  uint64_t seed, Device device, std::vector<int64_t> place);

  // The start-up note: method, tensors, error feedback, warm-up, bytes per step, and a
  // warning where the exchange moves more than the dense all-reduce (`zero1`: both
  // followed by ZeRO-1's gather of the stepped parameters, as dtrain estimate counts).
  std::string describe(bool zero1) const;
  // Before step `step`'s backward: dense for compress.warmup_steps, compressed after.
  void begin_step(int64_t step);
  // This rank's blobs for its shard of a checkpoint (every save with compression is
  // sharded: the residuals differ from rank to rank): "compress.residual", its own,
  // "compress.place", with `with_q` "compress.q", PowerSGD's Q (the same across a
  // data group), and in two_phase with error feedback "compress.server", its own server
  // residual, with "compress.server_place" (the place and the buckets' compressed sizes).
  std::vector<NamedTensor> state(bool with_q) const;
  // After a resume: this rank's residual and the Q from `blobs` (what its shard of a
  // checkpoint written by the same world size holds: runtime/train_state.h) where they
  // were made at this rank's place and fit its layout; false when something was missing
  // (error feedback then starts empty; so it does from the [world, layout] single files
  // of before 2026-12-06).
  bool restore(const std::vector<NamedTensor>& blobs);
  // After a restore() that returned true: whether the two-phase server residual came
  // back too (false: it starts empty, the checkpoint having been made with other
  // buckets or the gather exchange); true where there is none.
  bool restored_server() const {
    return restored_server_ || compressor_.server_residual().numel() == 0;
  }
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
  std::vector<int64_t> place_;
  std::vector<int64_t> server_place_;  // two_phase: place_ and every bucket's compressed size
  bool restored_server_ = false;
};

}  // namespace dtrain::runtime
