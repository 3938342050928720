// Bucket planning and the arm / ready / finish cycle of one optimizer step.
#include "dist/ddp.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::dist {

namespace {

using Clock = std::chrono::steady_clock;

Tensor range_of(const Tensor& flat, const Bucket& b) {
  return flat.view(b.begin, Shape{b.end - b.begin});
}

}  // namespace

std::vector<Bucket> plan_buckets(const std::vector<GradRange>& params, int64_t total_elems,
                                 size_t bucket_bytes) {
  std::vector<Bucket> out;
  int64_t end = total_elems;
  Bucket cur;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const GradRange& p = params[static_cast<size_t>(i)];
    DTRAIN_CHECK(p.offset >= 0 && p.offset + p.numel <= end, "param {} [{}, +{}) past {}", i,
                 p.offset, p.numel, end);
    cur.params.push_back(i);
    const auto bytes = static_cast<size_t>(end - p.offset) * sizeof(float);
    if (bytes >= bucket_bytes || i == 0) {
      cur.begin = i == 0 ? 0 : p.offset;  // the first bucket also takes any leading padding
      cur.end = end;
      end = cur.begin;
      out.push_back(std::move(cur));
      cur = Bucket{};
    }
  }
  if (params.empty() && total_elems > 0) out.push_back({0, total_elems, {}, {}});
  return out;
}

std::vector<OwnedPart> owned_parts(const Bucket& b,
                                   const std::vector<std::pair<int64_t, int64_t>>& owners) {
  std::vector<OwnedPart> parts;
  for (size_t r = 0; r < owners.size(); ++r) {
    const int64_t lo = std::max(b.begin, owners[r].first), hi = std::min(b.end, owners[r].second);
    if (lo < hi) parts.push_back({static_cast<int>(r), lo, hi});
  }
  return parts;
}

std::vector<Bucket> plan_buckets_of(const std::vector<GradRange>& params,
                                    const std::vector<int>& which, size_t bucket_bytes) {
  constexpr int64_t kPadding = 16;  // f32 elements between 64-byte aligned tensors
  std::vector<int> order = which;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return params[static_cast<size_t>(a)].offset < params[static_cast<size_t>(b)].offset;
  });
  std::vector<Bucket> out;
  Bucket cur;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const GradRange& p = params[static_cast<size_t>(*it)];
    if (cur.params.empty()) cur.end = p.offset + p.numel;
    cur.params.push_back(*it);
    cur.begin = p.offset;
    const auto next = std::next(it);
    const bool adjacent =
        next != order.rend() && p.offset - (params[static_cast<size_t>(*next)].offset +
                                            params[static_cast<size_t>(*next)].numel) <=
                                    kPadding;
    const auto bytes = static_cast<size_t>(cur.end - cur.begin) * sizeof(float);
    if (bytes >= bucket_bytes || !adjacent) {
      out.push_back(std::move(cur));
      cur = Bucket{};
    }
  }
  return out;
}

GradSync::GradSync(Communicator& comm, std::vector<Bucket> buckets, int num_params, Overlap overlap,
                   Unbucketed unbucketed)
    : comm_(comm),
      buckets_(std::move(buckets)),
      bucket_of_(static_cast<size_t>(num_params), -1),
      pending_(buckets_.size()),
      handles_(buckets_.size()),
      launched_(buckets_.size()),
      overlap_(overlap),
      comm_mark_(comm.stats()) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int p : buckets_[b].params) {
      DTRAIN_CHECK(p >= 0 && p < num_params && bucket_of_[static_cast<size_t>(p)] < 0,
                   "param {} in two buckets or out of range", p);
      bucket_of_[static_cast<size_t>(p)] = static_cast<int>(b);
    }
  }
  for (size_t p = 0; p < bucket_of_.size() && unbucketed == Unbucketed::refused; ++p)
    DTRAIN_CHECK(bucket_of_[p] >= 0, "param {} in no bucket", p);
}

void GradSync::set_algorithms(const std::vector<AllreduceAlgo>& per_bucket) {
  DTRAIN_CHECK(per_bucket.size() == buckets_.size(), "{} algorithms for {} buckets",
               per_bucket.size(), buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) buckets_[b].algo = per_bucket[b];
}

void GradSync::set_owners(std::vector<std::pair<int64_t, int64_t>> ranges) {
  DTRAIN_CHECK(static_cast<int>(ranges.size()) == comm_.size(), "{} owner ranges for {} ranks",
               ranges.size(), comm_.size());
  owners_ = std::move(ranges);
}

void GradSync::set_accumulation(Tensor grads, Tensor acc) {
  step_grads_ = std::move(grads);
  step_acc_ = std::move(acc);
}

void GradSync::before_backward(int micro, int micro_batches) {
  if (micro + 1 < micro_batches) return;
  DTRAIN_CHECK(step_grads_.defined() && (micro_batches == 1 || step_acc_.defined()),
               "GradSync: {} micro-batches without set_accumulation's buffers", micro_batches);
  arm(step_grads_, micro_batches > 1 ? step_acc_ : Tensor());
}

void GradSync::after_backward(int micro, int micro_batches) {
  if (micro + 1 == micro_batches) return;
  for (const Bucket& b : buckets_) {
    const Tensor g = range_of(step_grads_, b);
    Tensor acc = range_of(step_acc_, b);
    if (micro == 0) {
      kernels::copy(g, acc);
    } else {
      kernels::axpy(1.0f, g, acc);
    }
  }
}

void GradSync::arm(Tensor grads, Tensor acc) {
  DTRAIN_CHECK(!reducing_, "GradSync armed with exchanges in flight");
  grads_ = std::move(grads);
  acc_ = std::move(acc);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = static_cast<int>(buckets_[b].params.size());
    launched_[b] = 0;
    handles_[b].clear();
  }
  armed_ = true;
}

void GradSync::ready(int param) {
  if (!armed_) return;  // an accumulation micro-step: nothing moves
  const int b = bucket_of_.at(static_cast<size_t>(param));
  if (b < 0) return;  // not summed here (Unbucketed::skipped)
  if (--pending_[static_cast<size_t>(b)] == 0 && overlap_ == Overlap::on) {
    launch(static_cast<size_t>(b));
  }
}

// Every rank launches the buckets in the same order: backward visits the same graph.
void GradSync::launch(size_t b) {
  Tensor g = range_of(grads_, buckets_[b]);
  if (acc_.defined()) kernels::axpy(1.0f, range_of(acc_, buckets_[b]), g);
  stats_.bytes += static_cast<uint64_t>(g.nbytes());
  launched_[b] = 1;
  if (reducer_.start && reducer_on_) {
    trace_reduced(reducer_.advance());  // the buckets before move on first
    reducing_ = true;
    reducer_.start(b, grads_);
    return;
  }
  if (owners_.empty()) {
    handles_[b].push_back(comm_.all_reduce_async(g, ReduceOp::sum, buckets_[b].algo));
    return;
  }
  const Bucket& k = buckets_[b];
  for (const OwnedPart& p : owned_parts(k, owners_))
    handles_[b].push_back(comm_.reduce_async(g.view(p.lo - k.begin, Shape{p.hi - p.lo}), p.rank));
  // What lies outside the owners' span (a pipeline stage's copy of a weight tied to an
  // earlier stage, which that stage steps) is summed on every rank.
  const int64_t lo = owners_.front().first, hi = owners_.back().second;
  if (k.begin < lo) {
    const int64_t n = std::min(k.end, lo) - k.begin;
    handles_[b].push_back(comm_.all_reduce_async(g.view(0, Shape{n}), ReduceOp::sum, k.algo));
  }
  if (k.end > hi) {
    const int64_t from = std::max(k.begin, hi);
    handles_[b].push_back(
        comm_.all_reduce_async(g.view(from - k.begin, Shape{k.end - from}), ReduceOp::sum, k.algo));
  }
}

void GradSync::trace_reduced(const std::vector<Reduced>& done) {
  if (!trace_) return;
  for (const Reduced& r : done) {
    if (r.timing.seconds > 0)
      trace_(r.bucket, r.timing.start, r.timing.seconds,
             range_of(grads_, buckets_[r.bucket]).nbytes());
  }
}

std::string GradSync::exchange(size_t bucket) const {
  if (reducer_on_) return "compressed";
  if (!owners_.empty()) return "reduce(owners)";
  return fmt::format("all_reduce({})", to_string(buckets_[bucket].algo));
}

void GradSync::finish() {
  DTRAIN_CHECK(armed_, "GradSync::finish without arm");
  // On a GPU the host ran ahead of backward: wait for the device first, so that the
  // exposed time is what communication adds after backward has finished there.
  const auto after_backward = [&] {
    if (comm_.size() > 1 && !grads_.device().is_cpu()) kernels::synchronize(grads_.device());
    return Clock::now();
  };
  // The reducer's launches below (overlap off, or buckets backward never readied)
  // compress and wait on this thread: exposed time too.
  const bool reduced = reducer_.start && reducer_on_;
  Clock::time_point t0 = reduced ? after_backward() : Clock::time_point();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DTRAIN_CHECK(overlap_ == Overlap::off || pending_[b] == 0 || launched_[b] == 0,
                 "bucket {} launched early", b);
    if (!launched_[b]) launch(b);
  }
  if (!reduced) t0 = after_backward();
  if (reducing_) {
    reducing_ = false;
    trace_reduced(reducer_.complete());
  }
  for (std::vector<Handle>& hs : handles_)
    for (Handle& h : hs) h.wait();
  stats_.exposed_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  if (trace_) {
    for (size_t b = 0; b < buckets_.size(); ++b)
      for (const Handle& h : handles_[b]) {
        const Handle::Timing t = h.timing();
        if (t.seconds > 0) trace_(b, t.start, t.seconds, range_of(grads_, buckets_[b]).nbytes());
      }
  }
  armed_ = false;
  grads_ = Tensor();
  acc_ = Tensor();
}

SyncStats GradSync::take_stats() {
  const CommStats now = comm_.stats();
  SyncStats s = stats_;
  s.comm_seconds = now.seconds - comm_mark_.seconds;
  comm_mark_ = now;
  stats_ = SyncStats{};
  return s;
}

}  // namespace dtrain::dist
