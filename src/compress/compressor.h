// Gradient compression with error feedback, data-parallel bucket by bucket: the
// stage between "a bucket is ready" and the optimizer (dist::GradSync hands a bucket
// here instead of all-reducing it). Methods (compress.method):
//  - topk: each rank keeps the `ratio` largest-magnitude entries of its compressed
//    elements (exact selection, kernels/compress.h), the ranks' (index, value) pairs
//    are all-gathered and summed into a dense result in rank order;
//  - onebit: the sign of every entry, 32 to a word, and per chunk of 1024 entries the
//    mean magnitude; all-gathered, each rank's +-scale summed in rank order;
//  - powersgd: per matrix M (a parameter of 2+ dimensions viewed as its first dim by
//    the rest) P = M Q, P all-reduced (summed) and orthonormalised, Q = M^T P,
//    Q all-reduced, the result P Q^T; Q warm-starts the next step.
// Top-k and 1-bit exchange a bucket in one of two ways (compress.exchange, resolved by
// resolve_exchange): gather, as above (a rank receives every rank's compressed bucket:
// O(world) bytes per rank), or two_phase (O(1) per rank): the bucket's compressed
// elements are cut into one segment per rank (segment r: [E r / n, E (r + 1) / n)),
// each rank compresses every segment (top-k: round(ratio x segment) entries of each),
// an all-to-all sends segment r to rank r, which sums what it received in rank order,
// adds its server residual, compresses that sum again and all-gathers it; every rank
// then writes each rank's decompressed segment.
// Error feedback (compress.error_feedback): the residual, what this rank did not send,
// is added to its next gradient: for every rank, the sum of what it sent over the steps
// plus its residual is the sum of its gradients (exactly for topk, to rounding for the
// others). In two_phase the owner of a segment keeps a server residual too, what its
// second compression left out of the sum, added to the next step's sum (what arrives
// over the steps plus every residual is the sum of the gradients). Tensors that do not compress
// (1-D, small, or where PowerSGD's factors would not be smaller) are summed exactly by an
// all-reduce in the same bucket. A bucket's exchange runs in parts, so that its collectives
// overlap what the caller does next (the rest of backward): start() compresses and issues the
// first collectives; advance(), before the next bucket starts, waits for them and, where the
// exchange has a second collective (two_phase's all-gather, PowerSGD's Q), does the work
// between and issues it, the bucket completing at the following advance() (else there);
// complete() completes every bucket in flight. So up to two buckets are in flight, one in
// its first collective and one in its second: each collective has one bucket's backward
// to finish before it is waited for (on the caller's thread, which also does the owner's
// work between the two).
// Sums only, as GradSync: the caller scales. Device-neutral: the buffers live on the
// gradients' device and every step is a kernel of kernels/compress.h or a GEMM
// (PowerSGD's products), so the same code runs on the CPU and on CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "compress/options.h"
#include "dist/communicator.h"
#include "dist/ddp.h"
#include "kernels/gemm.h"

namespace dtrain::compress {

// A parameter's elements [lo, hi) of the fp32 layout, PowerSGD's rows x cols.
struct Piece {
  int64_t lo = 0, hi = 0;
  int64_t rows = 1, cols = 1;
};

struct BucketPlan {
  std::vector<Piece> compressed, dense;
};

// Every parameter of the layout: offset, element count, and its first dimension
// (0 for a 1-D tensor).
struct ParamInfo {
  int64_t offset = 0, numel = 0, rows = 0;
};

// Which parameters of each bucket compress: 2+-D tensors of at least `min_elems`
// elements (PowerSGD: also rank * (rows + cols) < rows * cols); the rest stays dense.
std::vector<BucketPlan> plan_compression(const CompressOptions& o,
                                         const std::vector<dist::Bucket>& buckets,
                                         const std::vector<ParamInfo>& params,
                                         int64_t min_elems = 1024);

// Bytes one rank contributes per step, compressed and as a dense all-reduce's payload.
struct Tally {
  uint64_t sent = 0, dense = 0;
};

// What one step sends per rank under `plans` on `world` data ranks (rank 0's: in
// two_phase the segments, hence the counts, differ by one entry from rank to rank):
// `dtrain validate` prints it, the trainer's start-up note too.
Tally bytes_per_step(const CompressOptions& o, const std::vector<BucketPlan>& plans, int world);

// The bus bytes (dist::CommStats' units: an all-reduce 2(n-1)/n of its buffer, an
// all-gather (n-1)/n of what it gathers) of one step's exchanges under `plans` on
// `world` ranks: what `dtrain estimate` reports as a compressed job's data traffic.
double bus_bytes_per_step(const CompressOptions& o, const std::vector<BucketPlan>& plans,
                          int world);

// The bytes the exchange of bucket plan `p` allocates on `world` ranks (each buffer
// rounded by `round`, the allocator's classes), above what was held before start():
// the most while start() runs, what it holds from its return until advance(), the
// most while advance() moves it on, what it holds from there until it completes (0
// where advance() completed it: one collective), the most while it completes (0 there).
// What a memory estimate adds around the moments a bucket's exchange starts, advances and
// completes (graph::ExchangeSequence walks them in the trainer's order).
struct ExchangeBytes {
  size_t start = 0, held = 0, advance = 0, held2 = 0, complete = 0;
};
ExchangeBytes exchange_bytes(const CompressOptions& o, const BucketPlan& p, int world,
                             Device device, const std::function<size_t(size_t)>& round);
// The elements of PowerSGD's Q over `plans` (kept between steps); 0 for other methods.
int64_t powersgd_q_elems(const CompressOptions& o, const std::vector<BucketPlan>& plans);
// The elements of the residual (Compressor::residual) under `plans`: every compressed
// piece's, none without error feedback.
int64_t residual_elems(const CompressOptions& o, const std::vector<BucketPlan>& plans);

// The elements of rank `rank`'s server residual (Compressor::server_residual) under
// `plans` on `world` data ranks: its segment of every bucket's compressed elements in
// two_phase with error feedback, none otherwise.
int64_t server_residual_elems(const CompressOptions& o, const std::vector<BucketPlan>& plans,
                              int world, int rank);

class Compressor {
 public:
  // `device`: where the gradients, the residual and PowerSGD's Q live.
  Compressor(const CompressOptions& o, dist::Communicator& comm, std::vector<BucketPlan> plans,
             int64_t layout_elems, AllreduceAlgo dense_algo, uint64_t seed,
             Device device = Device::cpu());
  ~Compressor();

  // Bucket b of the flat f32 gradient `grads` (the whole layout, this rank's sum over
  // its micro-batches): once complete, its compressed pieces hold the sum over the
  // ranks of what each sent and its dense pieces the exact sum. start() compresses and
  // issues the first collectives; the bucket's range of `grads` is written when it
  // completes (in advance() or complete()), and nobody may touch it in between. The
  // residual's part of the bucket is updated by start() (PowerSGD's by advance(),
  // needing the summed P); the server residual's by advance().
  // Every rank starts the same buckets in the same order and calls advance() at the same
  // points; advance() must come between two start()s. advance() completes the bucket in
  // its second collective, if any, and moves the one started last on: it waits for its
  // first collectives and issues its second, or completes it where there is none.
  // complete() completes every bucket in flight. Both return the buckets they completed,
  // in the order they started, with their collectives' span on the communicator (zeros
  // on the self one); without buckets in flight they do nothing.
  void start(size_t b, Tensor grads);
  std::vector<dist::Reduced> advance();
  std::vector<dist::Reduced> complete();
  // start() then complete().
  void reduce(size_t b, Tensor grads);
  const std::vector<BucketPlan>& plans() const { return plans_; }
  // This rank's error feedback, f32 on the device: compact, the compressed pieces one
  // after another in layout order, whatever the buckets (residual_elems; empty without
  // error feedback).
  Tensor residual() const { return residual_; }
  // PowerSGD: every matrix's Q, flat, on the device (the same on every rank);
  // undefined otherwise.
  Tensor powersgd_q() const { return q_; }
  // two_phase with error feedback: this rank's server residual, f32 on the device, its
  // segment of each bucket's compressed elements, bucket after bucket (empty otherwise).
  Tensor server_residual() const { return server_; }
  // The exchange this compressor runs (resolve_exchange for its communicator's size).
  CompressExchange exchange() const { return exchange_; }
  Tally take_tally();

 private:
  bool two_phase() const { return exchange_ == CompressExchange::two_phase; }
  Tensor scratch(int64_t n, DType dtype) const;
  // two_phase's buffers: one slot per rank, each `na` 32-bit integers (top-k's indices,
  // 1-bit's sign words) and then `nb` floats (values, scales), in one i32 buffer, so
  // that each phase is one collective.
  struct Slots {
    Tensor buf;
    int64_t na = 0, nb = 0;
    Tensor a(int64_t r, int64_t len) const;  // i32, the first `len` of slot r's na
    Tensor b(int64_t r, int64_t len) const;  // f32 over buf's storage: slot r's first `len` of nb
    Tensor slot(int64_t r) const { return buf.view(r * (na + nb), Shape{na + nb}); }
  };
  Slots slots(int64_t na, int64_t nb) const;
  Tensor input(const std::vector<Piece>& pieces, const Tensor& grads, int64_t res_lo) const;
  void gemm(const kernels::GemmArgs& args, const Tensor& a, const Tensor& b, Tensor c) const;
  struct Flight;
  void start_topk(const BucketPlan& p, Flight& f);
  void complete_topk(const BucketPlan& p, Flight& f);
  void start_onebit(const BucketPlan& p, Flight& f);
  void complete_onebit(const BucketPlan& p, Flight& f);
  void start_topk2(const BucketPlan& p, Flight& f);
  void advance_topk2(const BucketPlan& p, Flight& f);
  void complete_topk2(const BucketPlan& p, Flight& f);
  void start_onebit2(const BucketPlan& p, Flight& f);
  void advance_onebit2(const BucketPlan& p, Flight& f);
  void complete_onebit2(const BucketPlan& p, Flight& f);
  void start_powersgd(const BucketPlan& p, Flight& f);
  void advance_powersgd(const BucketPlan& p, Flight& f);
  void complete_powersgd(const BucketPlan& p, Flight& f);
  bool two_collectives(const BucketPlan& p) const;
  dist::Reduced finish(Flight& f);  // waits, writes the sum and frees the flight's buffers

  CompressOptions o_;
  dist::Communicator& comm_;
  std::vector<BucketPlan> plans_;
  AllreduceAlgo dense_algo_;
  Device device_;
  int64_t layout_elems_ = 0;
  CompressExchange exchange_;
  Tensor residual_, q_, server_;
  std::vector<int64_t> server_at_;  // per bucket: this rank's segment's offset in server_
  std::vector<int64_t> res_at_;     // per bucket: its pieces' offset in residual_
  // Per bucket, per compressed piece: offset in q_ (pieces in layout order, as residual_).
  std::vector<std::vector<int64_t>> q_at_;
  Tally tally_;
  std::unique_ptr<Flight> first_;   // the bucket started last, in its first collectives
  std::unique_ptr<Flight> second_;  // a bucket advanced and not completed: its second
};

}  // namespace dtrain::compress
