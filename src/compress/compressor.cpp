// See compressor.h.
#include "compress/compressor.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "kernels/compress.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/memory.h"

namespace dtrain::compress {

namespace {

constexpr int64_t kSignChunk = 1024;
constexpr uint32_t kPowerSgdPurpose = 7;  // Philox stream of the initial Q

int64_t total(const std::vector<Piece>& pieces) {
  int64_t n = 0;
  for (const Piece& p : pieces) n += p.hi - p.lo;
  return n;
}

// Device-side copies, ordered on the device's stream (plain memmoves on the host).
void copy(const Tensor& src, Tensor dst) {
  kernels::copy(src, dst, kernels::CopySync::stream_ordered);
}

// The pieces' elements of `flat`, one after another, into `packed` (and back).
void pack(const std::vector<Piece>& pieces, const Tensor& flat, const Tensor& packed) {
  int64_t at = 0;
  for (const Piece& p : pieces) {
    copy(flat.view(p.lo, Shape{p.hi - p.lo}), packed.view(at, Shape{p.hi - p.lo}));
    at += p.hi - p.lo;
  }
}
void unpack(const std::vector<Piece>& pieces, const Tensor& packed, const Tensor& flat) {
  int64_t at = 0;
  for (const Piece& p : pieces) {
    copy(packed.view(at, Shape{p.hi - p.lo}), flat.view(p.lo, Shape{p.hi - p.lo}));
    at += p.hi - p.lo;
  }
}

int64_t rank_of(const CompressOptions& o, const Piece& p) {
  return std::min({static_cast<int64_t>(o.rank), p.rows, p.cols});
}

// Top-k's entries out of n: round(ratio n), at least 1 (none of none).
int64_t topk_count(double ratio, int64_t n) {
  return n == 0 ? 0 : std::clamp<int64_t>(std::llround(ratio * static_cast<double>(n)), 1, n);
}

// two_phase: a bucket's e compressed elements cut into one segment per rank, their
// lengths within one of each other.
struct Segments {
  int64_t e = 0, n = 1;
  int64_t lo(int64_t r) const { return e * r / n; }
  int64_t len(int64_t r) const { return lo(r + 1) - lo(r); }
  int64_t most() const { return (e + n - 1) / n; }  // the longest segment
};

int64_t words_of(int64_t n) { return (n + 31) / 32; }
int64_t chunks_of(int64_t n) { return (n + kSignChunk - 1) / kSignChunk; }

}  // namespace

std::vector<BucketPlan> plan_compression(const CompressOptions& o,
                                         const std::vector<dist::Bucket>& buckets,
                                         const std::vector<ParamInfo>& params, int64_t min_elems) {
  std::vector<BucketPlan> plans;
  for (const dist::Bucket& b : buckets) {
    BucketPlan plan;
    std::vector<int> ps = b.params;
    std::sort(ps.begin(), ps.end());  // layout order
    for (int i : ps) {
      const ParamInfo& info = params[static_cast<size_t>(i)];
      Piece piece{info.offset, info.offset + info.numel, info.rows > 0 ? info.rows : 1,
                  info.rows > 0 ? info.numel / info.rows : info.numel};
      bool compress = info.rows > 0 && info.numel >= min_elems && piece.cols > 1;
      if (compress && o.method == CompressMethod::powersgd) {
        compress = o.rank * (piece.rows + piece.cols) < piece.rows * piece.cols;
      }
      (compress ? plan.compressed : plan.dense).push_back(piece);
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

int64_t powersgd_q_elems(const CompressOptions& o, const std::vector<BucketPlan>& plans) {
  if (o.method != CompressMethod::powersgd) return 0;
  int64_t n = 0;
  for (const BucketPlan& p : plans)
    for (const Piece& m : p.compressed) n += m.cols * rank_of(o, m);
  return std::max<int64_t>(n, 1);  // the constructor's buffer is never empty
}

int64_t residual_elems(const CompressOptions& o, const std::vector<BucketPlan>& plans) {
  if (!o.error_feedback) return 0;
  int64_t n = 0;
  for (const BucketPlan& p : plans) n += total(p.compressed);
  return n;
}

int64_t server_residual_elems(const CompressOptions& o, const std::vector<BucketPlan>& plans,
                              int world, int rank) {
  if (!o.error_feedback || resolve_exchange(o, world) != CompressExchange::two_phase) return 0;
  int64_t n = 0;
  for (const BucketPlan& p : plans) n += Segments{total(p.compressed), world}.len(rank);
  return n;
}

// Mirrors the allocations of start(), advance() and complete() below, in their order and
// lifetimes.
ExchangeBytes exchange_bytes(const CompressOptions& o, const BucketPlan& p, int world,
                             Device device, const std::function<size_t(size_t)>& round) {
  const auto f32 = [&](int64_t n) { return round(static_cast<size_t>(n) * 4); };
  const int64_t d = total(p.dense), n = total(p.compressed);
  const size_t dense = d > 0 ? f32(d) : 0;  // all-reduced from start() until the bucket completes
  ExchangeBytes e{dense, dense, dense, 0, 0};  // dense tensors alone: advance() completes it
  if (n == 0) return e;
  const size_t x = f32(n);  // input(): the packed gradient (the residual added in place)
  const bool two_phase = resolve_exchange(o, world) == CompressExchange::two_phase;
  const Segments seg{n, world};
  const auto topk_ws_bytes = [&](int64_t len) {
    return kernels::topk_workspace_bytes(std::max<int64_t>(len, 0), device);
  };
  const auto topk_ws = [&](size_t bytes) { return bytes == 0 ? size_t{0} : round(bytes); };
  switch (o.method) {
    case CompressMethod::topk: {
      if (two_phase) {
        // Start: the sent and the received pairs (held until advance), every segment's
        // selection's workspace. Advance: the sent pairs go, the owner's sum comes, the
        // received go, the gathered pairs and the server selection's workspace come, the
        // sum goes (the gathered held until complete). Complete: the whole bucket's sum.
        const int64_t most = seg.most(), slot = topk_count(o.ratio, most);
        const size_t pairs = f32(2 * slot * world), y = f32(most);
        const size_t ws = topk_ws(std::max(topk_ws_bytes(most), topk_ws_bytes(most - 1)));
        e.start = dense + x + 2 * pairs + ws;
        e.held = dense + 2 * pairs;
        e.advance =
            std::max({e.held, dense + pairs + y, dense + y + pairs + topk_ws(topk_ws_bytes(most))});
        e.held2 = dense + pairs;
        e.complete = dense + pairs + f32(n);
        break;
      }
      // Indices (i32) and values, gathered in one buffer; advance() completes it.
      const int64_t k = topk_count(o.ratio, n);
      const size_t gathered = f32(2 * k * world), ws = topk_ws(topk_ws_bytes(n));
      e.start = dense + x + gathered + ws;
      e.held = dense + gathered;
      e.advance = e.held + f32(n);  // the sum
      break;
    }
    case CompressMethod::onebit: {
      if (two_phase) {
        // Start: the sent and the received words and scales (held until advance), with
        // error feedback what was sent, decompressed. Advance: the sent go, the owner's
        // sum comes, the received go, the gathered come, with error feedback what the
        // owner sent, decompressed; the owner's sum goes (the gathered held until
        // complete). Complete: the whole bucket's sum.
        const int64_t most = seg.most();
        const size_t bits = f32((words_of(most) + chunks_of(most)) * world), y = f32(most),
                     fb = o.error_feedback ? f32(most) : 0;
        e.start = dense + x + 2 * bits + (o.error_feedback ? f32(n) : 0);
        e.held = dense + 2 * bits;
        e.advance = std::max({e.held, dense + bits + y, dense + y + bits + fb});
        e.held2 = dense + bits;
        e.complete = dense + bits + f32(n);
        break;
      }
      // Sign words and chunk scales, gathered in one buffer; advance() completes it.
      const size_t gathered = f32((words_of(n) + chunks_of(n)) * world);
      e.start = dense + x + gathered + (o.error_feedback ? f32(n) : 0);  // what was sent
      e.held = dense + gathered;
      e.advance = e.held + f32(n);  // the sum
      break;
    }
    case CompressMethod::powersgd: {
      // Every matrix's M (packed with its residual added), then P and per matrix the
      // workspace of M Q; held: the M's and P. Advance: Q, per matrix the workspace of
      // M^T P and with error feedback P Q^T beside its product's workspace; the M's
      // freed, Q all-reduced (P and Q held). Complete: per matrix the workspace of P Q^T.
      size_t ms = 0, ws_start = 0, ws_complete = 0, ws_last = 0;
      int64_t p_elems = 0, q_elems = 0;
      const auto ws_of = [&](const kernels::GemmArgs& a) {
        const size_t b = kernels::gemm_workspace_bytes(a, DType::f32, DType::f32, device);
        return round(std::max<size_t>(b, 1));  // Compressor::gemm allocates at least 1
      };
      for (const Piece& m : p.compressed) {
        const int64_t q = rank_of(o, m);
        ms += f32(m.hi - m.lo);
        p_elems += m.rows * q;
        q_elems += m.cols * q;
        kernels::GemmArgs mq, mtp, outer;
        mq.m = m.rows, mq.n = q, mq.k = m.cols;
        mtp.trans_a = kernels::Trans::yes;
        mtp.m = m.cols, mtp.n = q, mtp.k = m.rows;
        outer.trans_b = kernels::Trans::yes;
        outer.m = m.rows, outer.n = m.cols, outer.k = q;
        ws_start = std::max(ws_start, ws_of(mq));
        ws_complete = std::max(
            {ws_complete, ws_of(mtp), o.error_feedback ? f32(m.rows * m.cols) + ws_of(outer) : 0});
        ws_last = std::max(ws_last, ws_of(outer));
      }
      e.start = dense + ms + f32(p_elems) + ws_start;
      e.held = dense + ms + f32(p_elems);
      e.advance = e.held + f32(q_elems) + ws_complete;
      e.held2 = dense + f32(p_elems) + f32(q_elems);
      e.complete = e.held2 + ws_last;
      break;
    }
    case CompressMethod::none:
      break;
  }
  return e;
}

Compressor::Compressor(const CompressOptions& o, dist::Communicator& comm,
                       std::vector<BucketPlan> plans, int64_t layout_elems,
                       AllreduceAlgo dense_algo, uint64_t seed, Device device)
    : o_(o),
      comm_(comm),
      plans_(std::move(plans)),
      dense_algo_(dense_algo),
      device_(device),
      layout_elems_(layout_elems),
      exchange_(resolve_exchange(o, comm.size())) {
  DTRAIN_CHECK(o.method != CompressMethod::none, "a compressor without a method");
  // -0: adding it changes no value, not even a -0 gradient (x + +0 would turn -0 into
  // +0), so an empty residual leaves the gradient's bits as they are.
  // The residual and Q hold the compressed pieces in layout order, whatever the buckets
  // (a resume may change comm.bucket_mb): a bucket's pieces are consecutive there.
  struct At {
    int64_t lo;
    size_t b, i;
  };
  std::vector<At> order;
  for (size_t b = 0; b < plans_.size(); ++b)
    for (size_t i = 0; i < plans_[b].compressed.size(); ++i)
      order.push_back({plans_[b].compressed[i].lo, b, i});
  std::sort(order.begin(), order.end(), [](const At& x, const At& y) { return x.lo < y.lo; });
  std::vector<std::vector<int64_t>> res_of(plans_.size());
  for (size_t b = 0; b < plans_.size(); ++b) {
    res_of[b].resize(plans_[b].compressed.size());
    q_at_.emplace_back(plans_[b].compressed.size());
  }
  int64_t at = 0, n = 0;
  for (const At& a : order) {
    const Piece& m = plans_[a.b].compressed[a.i];
    res_of[a.b][a.i] = at;
    q_at_[a.b][a.i] = n;
    if (o_.error_feedback) at += m.hi - m.lo;
    if (o_.method == CompressMethod::powersgd) n += m.cols * rank_of(o_, m);
  }
  for (size_t b = 0; b < plans_.size(); ++b) {
    res_at_.push_back(res_of[b].empty() ? 0 : res_of[b][0]);
    int64_t next = res_at_.back();
    for (size_t i = 0; i < res_of[b].size(); ++i) {
      DTRAIN_CHECK(res_of[b][i] == next, "bucket {}'s compressed pieces are not consecutive", b);
      if (o_.error_feedback) next += plans_[b].compressed[i].hi - plans_[b].compressed[i].lo;
    }
  }
  residual_ = scratch(at, DType::f32);
  if (at > 0) kernels::fill(residual_, -0.0f);
  int64_t server = 0;
  for (const BucketPlan& p : plans_) {
    server_at_.push_back(server);
    server += server_residual_elems(o_, {p}, comm.size(), comm.rank());
  }
  server_ = scratch(server, DType::f32);
  if (server > 0) kernels::fill(server_, -0.0f);
  if (o.method != CompressMethod::powersgd) return;
  Tensor q = Tensor::empty(Shape{std::max<int64_t>(n, 1)}, DType::f32);
  const Philox rng(seed, rng_stream_id(kPowerSgdPurpose, 0, 0));  // the same Q on every rank
  rng.normals(0, q.numel(), q.data<float>());
  q_ = scratch(q.numel(), DType::f32);
  kernels::copy(q, q_);
}

Tensor Compressor::scratch(int64_t n, DType dtype) const {
  return Tensor::empty(Shape{n}, dtype, &kernels::device_allocator(device_));
}

Compressor::Slots Compressor::slots(int64_t na, int64_t nb) const {
  Slots s;
  s.na = na;
  s.nb = nb;
  s.buf = scratch((na + nb) * comm_.size(), DType::i32);
  return s;
}

Tensor Compressor::Slots::a(int64_t r, int64_t len) const {
  DTRAIN_CHECK(r >= 0 && (r + 1) * (na + nb) <= buf.numel() && len >= 0 && len <= na,
               "slot {}: {} of {} + {} in {}", r, len, na, nb, buf.str());
  return buf.view(r * (na + nb), Shape{len});
}

// A wrapped view's storage is its own (len floats): the bounds are checked here.
Tensor Compressor::Slots::b(int64_t r, int64_t len) const {
  DTRAIN_CHECK(r >= 0 && (r + 1) * (na + nb) <= buf.numel() && len >= 0 && len <= nb,
               "slot {}: {} of {} after {} in {}", r, len, nb, na, buf.str());
  int32_t* at = static_cast<int32_t*>(buf.raw()) + r * (na + nb) + na;
  return Tensor::wrap(at, Shape{len}, DType::f32, buf.device());
}

void Compressor::gemm(const kernels::GemmArgs& args, const Tensor& a, const Tensor& b,
                      Tensor c) const {
  const size_t bytes = kernels::gemm_workspace_bytes(args, DType::f32, DType::f32, device_);
  Tensor ws = scratch(static_cast<int64_t>(std::max<size_t>(bytes, 1)), DType::u8);
  kernels::gemm(args, a, b, c, kernels::Workspace{ws.raw(), bytes, device_});
}

// A bucket whose exchange has started and not completed: what advance() and complete()
// need.
struct Compressor::Flight {
  size_t b = 0;
  Tensor grads;
  Tensor dense;                    // the dense pieces, being all-reduced
  dist::Handle dense_done;         //
  std::vector<dist::Handle> done;  // the method's collectives
  // What this rank sent to each rank (two_phase) and what it got from each (gather:
  // every rank's compressed bucket; two_phase: every rank's part of its segment).
  Slots sent, got;
  Slots gathered;               // two_phase: every owner's compressed sum, being all-gathered
  std::vector<Tensor> ms;       // PowerSGD: every matrix's M (its residual added)
  std::vector<int64_t> res_lo;  // PowerSGD: each matrix's part of the residual
  Tensor ps;                    // PowerSGD: every matrix's P, being all-reduced
  Tensor qs;                    // PowerSGD: every matrix's Q, being all-reduced
  dist::Handle second;          // the second collective, once advanced
};

Compressor::~Compressor() = default;

void Compressor::reduce(size_t b, Tensor grads) {
  start(b, std::move(grads));
  complete();
}

// two_phase top-k and 1-bit, and PowerSGD: a second collective after the first's result.
bool Compressor::two_collectives(const BucketPlan& p) const {
  if (p.compressed.empty()) return false;
  return o_.method == CompressMethod::powersgd ||
         (two_phase() &&
          (o_.method == CompressMethod::topk || o_.method == CompressMethod::onebit));
}

void Compressor::start(size_t b, Tensor grads) {
  DTRAIN_CHECK(!first_, "bucket {}'s exchange started before bucket {}'s advanced", b,
               first_ ? first_->b : 0);
  DTRAIN_CHECK(
      grads.device() == device_ && grads.dtype() == DType::f32 && grads.numel() == layout_elems_,
      "compression of {} (f32 [{}] on {} expected)", grads.str(), layout_elems_, device_.str());
  const BucketPlan& p = plans_.at(b);
  first_ = std::make_unique<Flight>();
  Flight& f = *first_;
  f.b = b;
  f.grads = grads;
  if (const int64_t n = total(p.dense); n > 0) {
    f.dense = scratch(n, DType::f32);
    pack(p.dense, grads, f.dense);
    f.dense_done = comm_.all_reduce_async(f.dense, dist::ReduceOp::sum, dense_algo_);
    tally_.sent += static_cast<uint64_t>(n) * 4;
    tally_.dense += static_cast<uint64_t>(n) * 4;
  }
  if (p.compressed.empty()) return;
  switch (o_.method) {
    case CompressMethod::topk:
      two_phase() ? start_topk2(p, f) : start_topk(p, f);
      break;
    case CompressMethod::onebit:
      two_phase() ? start_onebit2(p, f) : start_onebit(p, f);
      break;
    case CompressMethod::powersgd:
      start_powersgd(p, f);
      break;
    case CompressMethod::none:
      break;
  }
}

std::vector<dist::Reduced> Compressor::advance() {
  std::vector<dist::Reduced> done;
  if (second_) {  // first: what it holds goes before the next one's second phase comes
    done.push_back(finish(*second_));
    second_.reset();
  }
  if (!first_) return done;
  const BucketPlan& p = plans_.at(first_->b);
  if (!two_collectives(p)) {
    done.push_back(finish(*first_));
    first_.reset();
    return done;
  }
  switch (o_.method) {
    case CompressMethod::topk:
      advance_topk2(p, *first_);
      break;
    case CompressMethod::onebit:
      advance_onebit2(p, *first_);
      break;
    case CompressMethod::powersgd:
      advance_powersgd(p, *first_);
      break;
    case CompressMethod::none:
      break;
  }
  second_ = std::move(first_);
  return done;
}

std::vector<dist::Reduced> Compressor::complete() {
  std::vector<dist::Reduced> done = advance();
  for (const dist::Reduced& r : advance()) done.push_back(r);
  return done;
}

dist::Reduced Compressor::finish(Flight& f) {
  const BucketPlan& p = plans_.at(f.b);
  if (f.second.valid()) {  // advanced: its second collective, before the method's completion
    f.second.wait();
    f.done.push_back(f.second);
  }
  if (!p.compressed.empty()) {
    switch (o_.method) {
      case CompressMethod::topk:
        two_phase() ? complete_topk2(p, f) : complete_topk(p, f);
        break;
      case CompressMethod::onebit:
        two_phase() ? complete_onebit2(p, f) : complete_onebit(p, f);
        break;
      case CompressMethod::powersgd:
        complete_powersgd(p, f);
        break;
      case CompressMethod::none:
        break;
    }
  }
  if (f.dense_done.valid()) {
    f.dense_done.wait();
    unpack(p.dense, f.dense, f.grads);
    f.done.push_back(f.dense_done);
  }
  // From the first collective's start to the last one's end, on the communicator.
  double lo = 0, hi = 0;
  for (const dist::Handle& h : f.done) {
    const dist::Handle::Timing t = h.timing();
    if (t.seconds <= 0) continue;
    lo = lo == 0 ? t.start : std::min(lo, t.start);
    hi = std::max(hi, t.start + t.seconds);
  }
  return {f.b, {lo, hi > lo ? hi - lo : 0}};
}

// The compressed pieces' gradient, one after another, with this rank's residual added
// (the pieces' part of the compact residual starts at `res_lo`).
Tensor Compressor::input(const std::vector<Piece>& pieces, const Tensor& grads,
                         int64_t res_lo) const {
  const int64_t n = total(pieces);
  Tensor x = scratch(n, DType::f32);
  pack(pieces, grads, x);
  if (o_.error_feedback) kernels::add(x, residual_.view(res_lo, Shape{n}), x);
  return x;
}

// Top-k selects straight into this rank's slot of the gathered pairs (its indices,
// then its values), which are then gathered in place, one collective.
void Compressor::start_topk(const BucketPlan& p, Flight& f) {
  const int64_t n = total(p.compressed);
  Tensor x = input(p.compressed, f.grads, res_at_[f.b]);
  const int64_t k = topk_count(o_.ratio, n);
  const int me = comm_.rank();
  f.got = slots(k, k);
  Tensor idx = f.got.a(me, k), val = f.got.b(me, k);
  {
    const size_t ws_bytes = kernels::topk_workspace_bytes(n, device_);
    Tensor ws = scratch(static_cast<int64_t>(ws_bytes), DType::u8);
    kernels::topk_select(x, idx, val, kernels::Workspace{ws.raw(), ws_bytes, device_});
  }
  if (o_.error_feedback) {  // what was not sent: x with the sent entries taken out
    kernels::clear_at(idx, x);
    copy(x, residual_.view(res_at_[f.b], Shape{n}));
  }
  x = Tensor();
  f.done.push_back(comm_.all_gather_async(f.got.slot(me), f.got.buf));
  tally_.sent += static_cast<uint64_t>(k) * 8;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::complete_topk(const BucketPlan& p, Flight& f) {
  for (dist::Handle& h : f.done) h.wait();
  // From -0, the identity of IEEE addition (-0 + x is x, even for x = -0), so that at
  // ratio 1 the sum is exactly an all-reduce's; the ranks' pairs added in rank order.
  Tensor sum = scratch(total(p.compressed), DType::f32);
  kernels::fill(sum, -0.0f);
  const int64_t k = f.got.na;
  for (int r = 0; r < comm_.size(); ++r) kernels::scatter_add(f.got.a(r, k), f.got.b(r, k), k, sum);
  unpack(p.compressed, sum, f.grads);
}

void Compressor::start_onebit(const BucketPlan& p, Flight& f) {
  const int64_t n = total(p.compressed);
  Tensor x = input(p.compressed, f.grads, res_at_[f.b]);
  const int me = comm_.rank();
  f.got = slots(words_of(n), chunks_of(n));
  Tensor words = f.got.a(me, words_of(n)), scales = f.got.b(me, chunks_of(n));
  kernels::sign_pack(x, kSignChunk, words, scales);
  if (o_.error_feedback) {  // residual = x - what this rank's bits and scales stand for
    Tensor mine = scratch(n, DType::f32);
    kernels::sign_unpack(words, scales, kSignChunk, mine, false);
    kernels::axpy(-1.0f, mine, x);
    copy(x, residual_.view(res_at_[f.b], Shape{n}));
  }
  x = Tensor();
  f.done.push_back(comm_.all_gather_async(f.got.slot(me), f.got.buf));
  tally_.sent += static_cast<uint64_t>(words_of(n) + chunks_of(n)) * 4;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::complete_onebit(const BucketPlan& p, Flight& f) {
  for (dist::Handle& h : f.done) h.wait();
  const int64_t n = total(p.compressed);
  Tensor sum = scratch(n, DType::f32);
  for (int r = 0; r < comm_.size(); ++r) {  // rank order: the same bits on every rank
    kernels::sign_unpack(f.got.a(r, words_of(n)), f.got.b(r, chunks_of(n)), kSignChunk, sum, r > 0);
  }
  unpack(p.compressed, sum, f.grads);
}

// two_phase top-k. Start: each segment's top-k into its slot of the sent pairs (the
// residual: x with every segment's sent entries taken out), all-to-all. Advance: this
// rank's segment summed from every rank's pairs in rank order, its server residual
// added, its top-k into this rank's slot of the gathered pairs (the server residual:
// the rest), all-gathered. Complete: every rank's pairs written into its segment of
// the sum.
void Compressor::start_topk2(const BucketPlan& p, Flight& f) {
  const int64_t n = total(p.compressed);
  const int world = comm_.size();
  const Segments seg{n, world};
  const int64_t slot = topk_count(o_.ratio, seg.most());
  Tensor x = input(p.compressed, f.grads, res_at_[f.b]);
  f.sent = slots(slot, slot);
  f.got = slots(slot, slot);
  {
    const size_t ws_bytes = std::max(kernels::topk_workspace_bytes(seg.most(), device_),
                                     kernels::topk_workspace_bytes(seg.most() - 1, device_));
    Tensor ws = scratch(static_cast<int64_t>(ws_bytes), DType::u8);
    for (int r = 0; r < world; ++r) {
      const int64_t len = seg.len(r), k = topk_count(o_.ratio, len);
      if (k == 0) continue;
      Tensor part = x.view(seg.lo(r), Shape{len});
      Tensor idx = f.sent.a(r, k), val = f.sent.b(r, k);
      kernels::topk_select(part, idx, val, kernels::Workspace{ws.raw(), ws_bytes, device_});
      if (o_.error_feedback) kernels::clear_at(idx, part);
      tally_.sent += static_cast<uint64_t>(k) * 8;
    }
  }
  if (o_.error_feedback) copy(x, residual_.view(res_at_[f.b], Shape{n}));
  x = Tensor();
  f.done.push_back(comm_.all_to_all_async(f.sent.buf, f.got.buf));
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::advance_topk2(const BucketPlan& p, Flight& f) {
  for (dist::Handle& h : f.done) h.wait();
  const int64_t n = total(p.compressed);
  const int world = comm_.size(), me = comm_.rank();
  const Segments seg{n, world};
  const int64_t len = seg.len(me), k = topk_count(o_.ratio, len);
  f.sent = Slots();
  Slots& gathered = f.gathered;
  {
    Tensor y = scratch(len, DType::f32);  // this rank's segment of the sum
    if (len > 0) {
      kernels::fill(y, -0.0f);
      for (int r = 0; r < world; ++r) kernels::scatter_add(f.got.a(r, k), f.got.b(r, k), k, y);
    }
    const int64_t na = f.got.na, nb = f.got.nb;
    f.got = Slots();  // before the gathered slots come
    gathered = slots(na, nb);
    if (len > 0) {
      if (o_.error_feedback) kernels::add(y, server_.view(server_at_[f.b], Shape{len}), y);
      Tensor idx = gathered.a(me, k), val = gathered.b(me, k);
      const size_t ws_bytes = kernels::topk_workspace_bytes(len, device_);
      Tensor ws = scratch(static_cast<int64_t>(ws_bytes), DType::u8);
      kernels::topk_select(y, idx, val, kernels::Workspace{ws.raw(), ws_bytes, device_});
      if (o_.error_feedback) {
        kernels::clear_at(idx, y);
        copy(y, server_.view(server_at_[f.b], Shape{len}));
      }
    }
  }
  f.second = comm_.all_gather_async(gathered.slot(me), gathered.buf);
  tally_.sent += static_cast<uint64_t>(k) * 8;
}

void Compressor::complete_topk2(const BucketPlan& p, Flight& f) {
  const int64_t n = total(p.compressed);
  const int world = comm_.size();
  const Segments seg{n, world};
  Tensor sum = scratch(n, DType::f32);
  kernels::fill(sum, -0.0f);
  for (int r = 0; r < world; ++r) {
    const int64_t kr = topk_count(o_.ratio, seg.len(r));
    if (kr == 0) continue;
    Tensor part = sum.view(seg.lo(r), Shape{seg.len(r)});
    kernels::scatter_add(f.gathered.a(r, kr), f.gathered.b(r, kr), kr, part);
  }
  unpack(p.compressed, sum, f.grads);
}

// two_phase 1-bit, as two_phase top-k with sign words and chunk scales: each segment
// packed into its slot; the owner's sum is every rank's unpacked segment added in rank
// order; the owner packs the sum (its server residual added) into its slot of the
// gathered ones.
void Compressor::start_onebit2(const BucketPlan& p, Flight& f) {
  const int64_t n = total(p.compressed);
  const int world = comm_.size();
  const Segments seg{n, world};
  Tensor x = input(p.compressed, f.grads, res_at_[f.b]);
  f.sent = slots(words_of(seg.most()), chunks_of(seg.most()));
  f.got = slots(f.sent.na, f.sent.nb);
  Tensor mine = o_.error_feedback ? scratch(n, DType::f32) : Tensor();
  for (int r = 0; r < world; ++r) {
    const int64_t len = seg.len(r);
    if (len == 0) continue;
    Tensor words = f.sent.a(r, words_of(len)), scales = f.sent.b(r, chunks_of(len));
    kernels::sign_pack(x.view(seg.lo(r), Shape{len}), kSignChunk, words, scales);
    Tensor out = o_.error_feedback ? mine.view(seg.lo(r), Shape{len}) : Tensor();
    if (o_.error_feedback) kernels::sign_unpack(words, scales, kSignChunk, out, false);
    tally_.sent += static_cast<uint64_t>(words_of(len) + chunks_of(len)) * 4;
  }
  if (o_.error_feedback) {  // residual = x - what this rank's bits and scales stand for
    kernels::axpy(-1.0f, mine, x);
    mine = Tensor();
    copy(x, residual_.view(res_at_[f.b], Shape{n}));
  }
  x = Tensor();
  f.done.push_back(comm_.all_to_all_async(f.sent.buf, f.got.buf));
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::advance_onebit2(const BucketPlan& p, Flight& f) {
  for (dist::Handle& h : f.done) h.wait();
  const int64_t n = total(p.compressed);
  const int world = comm_.size(), me = comm_.rank();
  const Segments seg{n, world};
  const int64_t len = seg.len(me);
  f.sent = Slots();
  Slots& gathered = f.gathered;
  {
    Tensor y = scratch(len, DType::f32);          // this rank's segment of the sum
    for (int r = 0; r < world && len > 0; ++r) {  // rank order: the same bits on every rank
      kernels::sign_unpack(f.got.a(r, words_of(len)), f.got.b(r, chunks_of(len)), kSignChunk, y,
                           r > 0);
    }
    const int64_t na = f.got.na, nb = f.got.nb;
    f.got = Slots();  // before the gathered slots come
    gathered = slots(na, nb);
    if (len > 0) {
      if (o_.error_feedback) kernels::add(y, server_.view(server_at_[f.b], Shape{len}), y);
      Tensor words = gathered.a(me, words_of(len)), scales = gathered.b(me, chunks_of(len));
      kernels::sign_pack(y, kSignChunk, words, scales);
      if (o_.error_feedback) {  // the server residual: the sum - what its bits stand for
        Tensor sent = scratch(len, DType::f32);
        kernels::sign_unpack(words, scales, kSignChunk, sent, false);
        kernels::axpy(-1.0f, sent, y);
        copy(y, server_.view(server_at_[f.b], Shape{len}));
      }
    }
  }
  f.second = comm_.all_gather_async(gathered.slot(me), gathered.buf);
  tally_.sent += static_cast<uint64_t>(words_of(len) + chunks_of(len)) * 4;
}

void Compressor::complete_onebit2(const BucketPlan& p, Flight& f) {
  const int64_t n = total(p.compressed);
  const int world = comm_.size();
  const Segments seg{n, world};
  Tensor sum = scratch(n, DType::f32);
  for (int r = 0; r < world; ++r) {
    const int64_t lr = seg.len(r);
    if (lr == 0) continue;
    Tensor part = sum.view(seg.lo(r), Shape{lr});
    kernels::sign_unpack(f.gathered.a(r, words_of(lr)), f.gathered.b(r, chunks_of(lr)), kSignChunk,
                         part, false);
  }
  unpack(p.compressed, sum, f.grads);
}

// Start: every matrix's M (with its residual), P = M Q (Q from the last step) for all
// of them in one buffer, all-reduced. Advance: P orthonormalised, Q = M^T P, the
// residual, Q all-reduced. Complete: the sum P Q^T.
void Compressor::start_powersgd(const BucketPlan& p, Flight& f) {
  using kernels::GemmArgs;
  int64_t p_elems = 0, r = res_at_[f.b];
  for (const Piece& m : p.compressed) {
    f.res_lo.push_back(r);
    r += m.hi - m.lo;
    f.ms.push_back(input({m}, f.grads, f.res_lo.back()).view(0, Shape{m.rows, m.cols}));
    p_elems += m.rows * rank_of(o_, m);
  }
  f.ps = scratch(p_elems, DType::f32);
  int64_t at = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    GemmArgs args;
    args.m = m.rows, args.n = q, args.k = m.cols;
    gemm(args, f.ms[i], q_.view(q_at_[f.b][i], Shape{m.cols, q}), f.ps.view(at, Shape{m.rows, q}));
    at += m.rows * q;
  }
  f.done.push_back(comm_.all_reduce_async(f.ps, dist::ReduceOp::sum, dense_algo_));
  tally_.sent += static_cast<uint64_t>(p_elems) * 4;
  tally_.dense += static_cast<uint64_t>(total(p.compressed)) * 4;
}

void Compressor::advance_powersgd(const BucketPlan& p, Flight& f) {
  using kernels::GemmArgs;
  using kernels::Trans;
  for (dist::Handle& h : f.done) h.wait();
  int64_t q_elems = 0;
  for (const Piece& m : p.compressed) q_elems += m.cols * rank_of(o_, m);
  f.qs = scratch(q_elems, DType::f32);
  Tensor& qs = f.qs;
  int64_t at = 0, qt = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // orthonormal P, then Q = M^T P
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    Tensor pm = f.ps.view(at, Shape{m.rows, q}), qm = qs.view(qt, Shape{m.cols, q});
    kernels::orthonormalize_columns(pm);
    GemmArgs args;
    args.trans_a = Trans::yes;
    args.m = m.cols, args.n = q, args.k = m.rows;
    gemm(args, f.ms[i], pm, qm);
    if (o_.error_feedback) {  // residual = M - P Q_mine^T: what this rank's Q leaves out
      Tensor approx = scratch(m.rows * m.cols, DType::f32);
      GemmArgs outer;
      outer.trans_b = Trans::yes;
      outer.m = m.rows, outer.n = m.cols, outer.k = q;
      gemm(outer, pm, qm, approx.view(0, Shape{m.rows, m.cols}));
      kernels::axpy(-1.0f, approx, f.ms[i]);
      copy(f.ms[i], residual_.view(f.res_lo[i], Shape{m.rows, m.cols}));
    }
    at += m.rows * q;
    qt += m.cols * q;
  }
  f.ms.clear();
  f.second = comm_.all_reduce_async(qs, dist::ReduceOp::sum, dense_algo_);
  tally_.sent += static_cast<uint64_t>(q_elems) * 4;
}

void Compressor::complete_powersgd(const BucketPlan& p, Flight& f) {
  using kernels::GemmArgs;
  using kernels::Trans;
  const Tensor& qs = f.qs;
  int64_t at = 0, qt = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // the sum: P Q^T; Q kept for next time
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    Tensor qm = qs.view(qt, Shape{m.cols, q});
    copy(qm, q_.view(q_at_[f.b][i], Shape{m.cols, q}));
    GemmArgs outer;
    outer.trans_b = Trans::yes;
    outer.m = m.rows, outer.n = m.cols, outer.k = q;
    gemm(outer, f.ps.view(at, Shape{m.rows, q}), qm, f.grads.view(m.lo, Shape{m.rows, m.cols}));
    at += m.rows * q;
    qt += m.cols * q;
  }
}

Tally Compressor::take_tally() {
  const Tally t = tally_;
  tally_ = Tally{};
  return t;
}

Tally bytes_per_step(const CompressOptions& o, const std::vector<BucketPlan>& plans, int world) {
  const bool two_phase = resolve_exchange(o, world) == CompressExchange::two_phase;
  Tally t;
  for (const BucketPlan& p : plans) {
    const auto dense = static_cast<uint64_t>(total(p.dense)) * 4;
    t.sent += dense;
    t.dense += dense + static_cast<uint64_t>(total(p.compressed)) * 4;
    const int64_t n = total(p.compressed);
    if (n == 0) continue;
    const Segments seg{n, world};
    switch (o.method) {
      case CompressMethod::topk:  // two_phase: every segment's, then rank 0's sum's
        if (!two_phase) {
          t.sent += static_cast<uint64_t>(topk_count(o.ratio, n)) * 8;
          break;
        }
        for (int r = 0; r < world; ++r)
          t.sent += static_cast<uint64_t>(topk_count(o.ratio, seg.len(r))) * 8;
        t.sent += static_cast<uint64_t>(topk_count(o.ratio, seg.len(0))) * 8;
        break;
      case CompressMethod::onebit:
        if (!two_phase) {
          t.sent += static_cast<uint64_t>(words_of(n) + chunks_of(n)) * 4;
          break;
        }
        for (int r = 0; r < world; ++r)
          t.sent += static_cast<uint64_t>(words_of(seg.len(r)) + chunks_of(seg.len(r))) * 4;
        t.sent += static_cast<uint64_t>(words_of(seg.len(0)) + chunks_of(seg.len(0))) * 4;
        break;
      case CompressMethod::powersgd:
        for (const Piece& m : p.compressed)
          t.sent += static_cast<uint64_t>((m.rows + m.cols) * rank_of(o, m)) * 4;
        break;
      case CompressMethod::none:
        break;
    }
  }
  return t;
}

double bus_bytes_per_step(const CompressOptions& o, const std::vector<BucketPlan>& plans,
                          int world) {
  if (world < 2) return 0;
  const bool two_phase = resolve_exchange(o, world) == CompressExchange::two_phase;
  const double n = world, reduce = 2.0 * (n - 1) / n, gather = n - 1;  // per byte sent
  double bus = 0;
  for (const BucketPlan& p : plans) {
    bus += reduce * 4.0 * static_cast<double>(total(p.dense));
    const int64_t c = total(p.compressed);
    if (c == 0) continue;
    // two_phase: an all-to-all and an all-gather of a slot per rank each, (n-1)/n of
    // their n slots: what the communicator counts.
    const int64_t most = Segments{c, world}.most();
    switch (o.method) {
      case CompressMethod::topk:  // indices and values: 8 bytes an entry
        bus += two_phase ? 2 * gather * 8.0 * static_cast<double>(topk_count(o.ratio, most))
                         : gather * 8.0 * static_cast<double>(topk_count(o.ratio, c));
        break;
      case CompressMethod::onebit:  // sign words and chunk scales
        bus += two_phase ? 2 * gather * 4.0 * static_cast<double>(words_of(most) + chunks_of(most))
                         : gather * 4.0 * static_cast<double>(words_of(c) + chunks_of(c));
        break;
      case CompressMethod::powersgd:  // P and Q, all-reduced
        for (const Piece& m : p.compressed)
          bus += reduce * 4.0 * static_cast<double>((m.rows + m.cols) * rank_of(o, m));
        break;
      case CompressMethod::none:
        break;
    }
  }
  return bus;
}

}  // namespace dtrain::compress
