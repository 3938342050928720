// Data-parallel gradient sync (DDP): the flat gradient buffer is cut once into
// buckets, contiguous ranges taken from its end (the parameters whose gradients
// backward finishes first), each all-reduced as a view of the buffer (no copy) the
// moment its last gradient is ready, so communication overlaps the rest of backward.
// Accumulation micro-steps communicate nothing: the last micro-step adds the local
// accumulator into each bucket just before sending it. Sums only; the caller scales
// once by 1 / (labels in the global batch). Knows nothing of graphs or optimizers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"

namespace dtrain::dist {

// One parameter's gradient: elements [offset, offset + numel) of the flat buffer.
struct GradRange {
  int64_t offset = 0;
  int64_t numel = 0;
};

// A bucket whose exchange a reducer completed (GradSync::Reducer) and its collectives'
// span on the communicator.
struct Reduced {
  size_t bucket = 0;
  Handle::Timing timing;
};

struct Bucket {
  int64_t begin = 0, end = 0;  // elements [begin, end) of the flat buffer (padding included)
  std::vector<int> params;     // indices into the GradRange list, in the order they finish
  AllreduceAlgo algo = AllreduceAlgo::native;
};

// Buckets of at least `bucket_bytes` of f32 (the last one may be smaller; 0: one
// bucket per parameter), from the buffer's end towards its start, tiling
// [0, total_elems). `params` must be in increasing offset order.
std::vector<Bucket> plan_buckets(const std::vector<GradRange>& params, int64_t total_elems,
                                 size_t bucket_bytes);

// ZeRO: the parts of bucket `b` that each rank owns, `owners` being every rank's
// [begin, end) of the layout in rank order; empty parts are left out.
struct OwnedPart {
  int rank = 0;
  int64_t lo = 0, hi = 0;
};
std::vector<OwnedPart> owned_parts(const Bucket& b,
                                   const std::vector<std::pair<int64_t, int64_t>>& owners);

enum class Overlap : uint8_t { off, on };

struct SyncStats {
  uint64_t bytes = 0;          // all-reduced payload
  double comm_seconds = 0;     // time the all-reduces ran (the communicator's worker)
  double exposed_seconds = 0;  // time finish() waited after backward
};

// What the profiler sees of a gradient exchange (GradSync, ZeRO-2's ShardedGradSync):
// its buckets, how each is exchanged, and while a trace function is set, every bucket's
// exchange of a step as (bucket, start in steady_clock seconds, seconds, payload bytes).
class TracedBuckets {
 public:
  using TraceFn = std::function<void(size_t bucket, double start, double seconds, uint64_t bytes)>;
  virtual ~TracedBuckets() = default;
  virtual const std::vector<Bucket>& buckets() const = 0;
  virtual std::string exchange(size_t bucket) const = 0;  // "all_reduce(ring)", ...
  virtual void set_trace(TraceFn trace) = 0;              // null: record nothing
};

// The gradient stage of a training step as the trainer drives it, whichever exchange
// it is (GradSync's buckets below, ZeRO-2's ShardedGradSync): around each micro-batch's
// backward, the executor's grad_ready hook calling ready() in between, and finish()
// after the step's last micro-batch. Then the summed gradient is where the optimizer
// reads it (GradSync: the flat buffer; ZeRO-2: this rank's shard).
class StepGradients : public TracedBuckets {
 public:
  virtual void before_backward(int micro, int micro_batches) = 0;
  virtual void ready(int param) = 0;
  virtual void after_backward(int micro, int micro_batches) = 0;
  virtual void finish() = 0;
  // Since the last call: bytes, comm time, exposed time.
  virtual SyncStats take_stats() = 0;
};

// Buckets over some of the parameters only, `which` (indices into `params`, a pipeline
// stage's): each spans its parameters' elements from the first one's offset to the last
// one's end, closing at `bucket_bytes` or where the next parameter is not adjacent (more
// than alignment padding between), so nothing outside `which` is sent.
std::vector<Bucket> plan_buckets_of(const std::vector<GradRange>& params,
                                    const std::vector<int>& which, size_t bucket_bytes);

// Parameters in no bucket: an error (every gradient must be summed), or skipped (a
// pipeline stage's buckets hold its own parameters; the others get no gradient there).
enum class Unbucketed : uint8_t { refused, skipped };

class GradSync : public StepGradients {
 public:
  // `algos`: the all-reduce algorithm of each bucket (auto resolved by the caller).
  GradSync(Communicator& comm, std::vector<Bucket> buckets, int num_params, Overlap overlap,
           Unbucketed unbucketed = Unbucketed::refused);

  const std::vector<Bucket>& buckets() const override { return buckets_; }
  // all_reduce(<algorithm>), reduce(owners) under ZeRO-1, compressed while the reducer is on.
  std::string exchange(size_t bucket) const override;
  void set_algorithms(const std::vector<AllreduceAlgo>& per_bucket);
  // ZeRO-1: instead of all-reducing a bucket, reduce each part of it into the rank
  // that owns that range (every rank's [begin, end), in rank order): afterwards only
  // this rank's own range of `grads` holds the sum (the volume of a reduce-scatter).
  // The ranges are contiguous; a bucket's part outside them is all-reduced (a pipeline
  // stage's copy of a weight an earlier stage steps: runtime/pipeline.h).
  void set_owners(std::vector<std::pair<int64_t, int64_t>> ranges);
  // Gradient compression (src/compress): while on, a ready bucket goes to the reducer
  // instead of the all-reduce: `start(b, grads)` (on the caller's thread; `grads` the
  // whole flat buffer, the bucket's accumulation already added) begins its exchange;
  // `advance()`, called before the next bucket starts, moves the exchanges in flight
  // on (an exchange of two collectives issues its second there and completes at the
  // following advance()); `complete()`, in finish(), completes every one. A bucket
  // completed leaves its sum over the ranks in `grads` on every rank; both return the
  // buckets they completed with their collectives' span (for the trace). So a bucket's
  // exchange runs while backward computes the next one's (or two's) gradients.
  struct Reducer {
    std::function<void(size_t bucket, Tensor grads)> start;
    std::function<std::vector<Reduced>()> advance;
    std::function<std::vector<Reduced>()> complete;
  };
  void set_reducer(Reducer reducer) { reducer_ = std::move(reducer); }
  void use_reducer(bool on) { reducer_on_ = on; }
  // The profiler's view (TracedBuckets): reported after each step's finish().
  void set_trace(TraceFn trace) override { trace_ = std::move(trace); }

  // Where a step's micro-batches add up (StepGradients): backward writes `grads` (the
  // flat f32 buffer); after each micro-batch but the last, its buckets' ranges are
  // summed into `acc` (the rest of the layout is never sent: a pipeline stage's other
  // stages' parameters, padding), and the last one's backward adds them back bucket by
  // bucket as it sends them. `acc` may be undefined when every step has one micro-batch.
  void set_accumulation(Tensor grads, Tensor acc);
  void before_backward(int micro, int micro_batches) override;  // the last one arms
  void after_backward(int micro, int micro_batches) override;   // the others accumulate
  // The executor's grad_ready hook (param index into the GradRange list).
  void ready(int param) override;
  // After backward: sends what has not gone yet, waits for every bucket. Afterwards
  // `grads` holds the sum over all ranks and micro-steps, identical on every rank.
  void finish() override;
  SyncStats take_stats() override;

 private:
  // Before the last micro-step's backward: `grads` is the flat f32 buffer backward
  // writes, `acc` the sum of the step's earlier micro-steps (undefined when none).
  void arm(Tensor grads, Tensor acc);
  void launch(size_t b);
  void trace_reduced(const std::vector<Reduced>& done);

  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per param
  std::vector<int> pending_;    // per bucket: gradients not yet ready
  std::vector<std::vector<Handle>> handles_;
  std::vector<std::pair<int64_t, int64_t>> owners_;
  Reducer reducer_;
  bool reducing_ = false;  // the reducer has buckets started and not completed
  TraceFn trace_;
  bool reducer_on_ = false;
  std::vector<char> launched_;
  Overlap overlap_;
  Tensor grads_, acc_;
  Tensor step_grads_, step_acc_;  // set_accumulation's
  bool armed_ = false;
  SyncStats stats_;
  CommStats comm_mark_;
};

}  // namespace dtrain::dist
