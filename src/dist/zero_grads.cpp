// See zero_grads.h.
#include "dist/zero_grads.h"

#include <algorithm>
#include <chrono>

#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::dist {

ShardedGradSync::ShardedGradSync(Communicator& comm, std::vector<Bucket> buckets,
                                 const std::vector<GradRange>& params,
                                 std::vector<std::pair<int64_t, int64_t>> ranges, Tensor shard,
                                 Unbucketed unbucketed)
    : comm_(comm),
      buckets_(std::move(buckets)),
      params_(params),
      ranges_(std::move(ranges)),
      shard_(std::move(shard)),
      bucket_of_(params.size(), -1),
      pending_(buckets_.size(), 0),
      buffers_(buckets_.size()) {
  DTRAIN_CHECK(static_cast<int>(ranges_.size()) == comm.size(), "{} shard ranges for {} ranks",
               ranges_.size(), comm.size());
  const auto& mine = ranges_[static_cast<size_t>(comm.rank())];
  DTRAIN_CHECK(shard_.numel() == mine.second - mine.first, "a shard of {} for [{}, {})",
               shard_.numel(), mine.first, mine.second);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int p : buckets_[b].params) bucket_of_[static_cast<size_t>(p)] = static_cast<int>(b);
  }
  bool every = true;
  for (size_t p = 0; p < params.size(); ++p) {
    DTRAIN_CHECK(bucket_of_[p] >= 0 || unbucketed == Unbucketed::skipped,
                 "parameter {} is in no bucket", p);
    every = every && bucket_of_[p] >= 0;
  }
  // The buckets write only their own parts of the shard: the rest (frozen) stays zero.
  if (!every) kernels::fill(shard_, 0.0f);
  begin_micro(true);
}

void ShardedGradSync::begin_micro(bool first) {
  first_ = first;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DTRAIN_CHECK(!buffers_[b].defined(), "bucket {} was not reduced in the last backward", b);
    pending_[b] = static_cast<int>(buckets_[b].params.size());
  }
}

Tensor ShardedGradSync::grad_view(int param, const Shape& shape) {
  DTRAIN_CHECK(bucket_of_[static_cast<size_t>(param)] >= 0,
               "parameter {} is in no bucket: its gradient has no storage", param);
  const auto b = static_cast<size_t>(bucket_of_[static_cast<size_t>(param)]);
  const Bucket& k = buckets_[b];
  if (!buffers_[b].defined()) {
    buffers_[b] = Tensor::empty(Shape{k.end - k.begin}, DType::f32,
                                &kernels::device_allocator(shard_.device()));
    kernels::fill(buffers_[b], 0.0f);
  }
  const GradRange& r = params_[static_cast<size_t>(param)];
  return buffers_[b].view(r.offset - k.begin, shape);
}

void ShardedGradSync::ready(int param) {
  if (bucket_of_[static_cast<size_t>(param)] < 0) return;  // Unbucketed::skipped
  const auto b = static_cast<size_t>(bucket_of_[static_cast<size_t>(param)]);
  DTRAIN_CHECK(pending_[b] > 0, "parameter {} reported ready twice", param);
  if (--pending_[b] == 0) reduce(b);
}

// Each owner's part of the bucket is summed into it; the owner adds it into its shard.
void ShardedGradSync::reduce(size_t b) {
  const Bucket& k = buckets_[b];
  Tensor& buf = buffers_[b];
  DTRAIN_CHECK(buf.defined(), "bucket {} reduced before any gradient was written", b);
  const int me = comm_.rank();
  const int64_t mine = ranges_[static_cast<size_t>(me)].first;
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (const OwnedPart& p : owned_parts(k, ranges_)) {
    Tensor part = buf.view(p.lo - k.begin, Shape{p.hi - p.lo});
    comm_.reduce(part, p.rank);
    bytes += static_cast<uint64_t>(part.nbytes());
    if (p.rank != me) continue;
    Tensor into = shard_.view(p.lo - mine, Shape{p.hi - p.lo});
    if (first_) {
      kernels::copy(part, into);
    } else {
      kernels::axpy(1.0f, part, into);
    }
  }
  stats_.bytes += bytes;
  if (trace_) {
    const auto t1 = std::chrono::steady_clock::now();
    trace_(b, std::chrono::duration<double>(t0.time_since_epoch()).count(),
           std::chrono::duration<double>(t1 - t0).count(), bytes);
  }
  buf = Tensor();
}

void ShardedGradSync::end_micro() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DTRAIN_CHECK(pending_[b] == 0 && !buffers_[b].defined(),
                 "bucket {}: {} gradient(s) never reported ready", b, pending_[b]);
  }
}

SyncStats ShardedGradSync::take_stats() {
  const CommStats now = comm_.stats();
  SyncStats s = stats_;
  s.comm_seconds = now.seconds - comm_mark_.seconds;
  comm_mark_ = now;
  stats_ = SyncStats{};
  return s;
}

}  // namespace dtrain::dist
