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

// Mirrors the allocations of reduce() below, in their order and lifetimes.
size_t exchange_bytes(const CompressOptions& o, const BucketPlan& p, int world, Device device,
                      const std::function<size_t(size_t)>& round) {
  const auto f32 = [&](int64_t n) { return round(static_cast<size_t>(n) * 4); };
  const int64_t n = total(p.compressed);
  size_t high = 0;
  if (n > 0) {
    // input(): the packed gradient (the residual, compact, is added in place).
    const size_t x = f32(n);
    const size_t in = x;
    switch (o.method) {
      case CompressMethod::topk: {
        const int64_t k = std::clamp<int64_t>(std::llround(o.ratio * static_cast<double>(n)), 1, n);
        const size_t pairs = 2 * f32(k);  // indices (i32) and values
        const size_t ws_bytes = kernels::topk_workspace_bytes(n, device);
        const size_t ws = ws_bytes == 0 ? 0 : round(ws_bytes);
        high = std::max(in, x + pairs + ws + 2 * f32(k * world) + f32(n));
        break;
      }
      case CompressMethod::onebit: {
        const int64_t words = (n + 31) / 32, chunks = (n + kSignChunk - 1) / kSignChunk;
        const size_t packed = f32(words) + f32(chunks);
        const size_t mine = o.error_feedback ? x + packed + f32(n) : 0;
        high = std::max({in, mine, x + packed + f32(words * world) + f32(chunks * world) + f32(n)});
        break;
      }
      case CompressMethod::powersgd: {
        // All matrices' M (each packed with its residual added), then P and Q; per matrix
        // the workspace of M Q, of M^T P, and with error feedback P Q^T beside the
        // workspace of its product (powersgd() below).
        size_t ms = 0, largest = 0;
        int64_t p_elems = 0, q_elems = 0;
        const auto ws_of = [&](const kernels::GemmArgs& a) {
          const size_t b = kernels::gemm_workspace_bytes(a, DType::f32, DType::f32, device);
          return round(std::max<size_t>(b, 1));  // Compressor::gemm allocates at least 1
        };
        for (const Piece& m : p.compressed) {
          const int64_t q = rank_of(o, m);
          high = std::max(high, ms + f32(m.hi - m.lo));
          ms += f32(m.hi - m.lo);
          p_elems += m.rows * q;
          q_elems += m.cols * q;
          kernels::GemmArgs mq, mtp, outer;
          mq.m = m.rows, mq.n = q, mq.k = m.cols;
          mtp.trans_a = kernels::Trans::yes;
          mtp.m = m.cols, mtp.n = q, mtp.k = m.rows;
          outer.trans_b = kernels::Trans::yes;
          outer.m = m.rows, outer.n = m.cols, outer.k = q;
          largest = std::max({largest, ws_of(mq), ws_of(mtp),
                              (o.error_feedback ? f32(m.rows * m.cols) : 0) + ws_of(outer)});
        }
        high = std::max(high, ms + f32(p_elems) + f32(q_elems) + largest);
        break;
      }
      case CompressMethod::none:
        break;
    }
  }
  return std::max(high, total(p.dense) > 0 ? f32(total(p.dense)) : 0);  // dense() after
}

Compressor::Compressor(const CompressOptions& o, dist::Communicator& comm,
                       std::vector<BucketPlan> plans, int64_t layout_elems,
                       AllreduceAlgo dense_algo, uint64_t seed, Device device)
    : o_(o),
      comm_(comm),
      plans_(std::move(plans)),
      dense_algo_(dense_algo),
      device_(device),
      layout_elems_(layout_elems) {
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
  if (o.method != CompressMethod::powersgd) return;
  Tensor q = Tensor::empty(Shape{std::max<int64_t>(n, 1)}, DType::f32);
  const Philox rng(seed, rng_stream_id(kPowerSgdPurpose, 0, 0));  // the same Q on every rank
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = rng.normal(static_cast<uint64_t>(i));
  q_ = scratch(q.numel(), DType::f32);
  kernels::copy(q, q_);
}

Tensor Compressor::scratch(int64_t n, DType dtype) const {
  return Tensor::empty(Shape{n}, dtype, &kernels::device_allocator(device_));
}

void Compressor::gemm(const kernels::GemmArgs& args, const Tensor& a, const Tensor& b,
                      Tensor c) const {
  const size_t bytes = kernels::gemm_workspace_bytes(args, DType::f32, DType::f32, device_);
  Tensor ws = scratch(static_cast<int64_t>(std::max<size_t>(bytes, 1)), DType::u8);
  kernels::gemm(args, a, b, c, kernels::Workspace{ws.raw(), bytes, device_});
}

void Compressor::reduce(size_t b, Tensor grads) {
  DTRAIN_CHECK(
      grads.device() == device_ && grads.dtype() == DType::f32 && grads.numel() == layout_elems_,
      "compression of {} (f32 [{}] on {} expected)", grads.str(), layout_elems_, device_.str());
  const BucketPlan& p = plans_.at(b);
  if (!p.compressed.empty()) {
    switch (o_.method) {
      case CompressMethod::topk:
        topk(b, p, grads);
        break;
      case CompressMethod::onebit:
        onebit(b, p, grads);
        break;
      case CompressMethod::powersgd:
        powersgd(b, p, grads);
        break;
      case CompressMethod::none:
        break;
    }
  }
  dense(p, grads);
}

void Compressor::dense(const BucketPlan& p, Tensor& grads) {
  const int64_t n = total(p.dense);
  if (n == 0) return;
  Tensor buf = scratch(n, DType::f32);
  pack(p.dense, grads, buf);
  comm_.all_reduce(buf, dist::ReduceOp::sum, dense_algo_);
  unpack(p.dense, buf, grads);
  tally_.sent += static_cast<uint64_t>(n) * 4;
  tally_.dense += static_cast<uint64_t>(n) * 4;
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

void Compressor::topk(size_t b, const BucketPlan& p, Tensor& grads) {
  const int64_t n = total(p.compressed);
  Tensor x = input(p.compressed, grads, res_at_[b]);
  const int64_t k = std::clamp<int64_t>(std::llround(o_.ratio * static_cast<double>(n)), 1, n);
  Tensor idx = scratch(k, DType::i32), val = scratch(k, DType::f32);
  const size_t ws_bytes = kernels::topk_workspace_bytes(n, device_);
  Tensor ws = scratch(static_cast<int64_t>(ws_bytes), DType::u8);
  kernels::topk_select(x, idx, val, kernels::Workspace{ws.raw(), ws_bytes, device_});
  if (o_.error_feedback) {  // what was not sent: x with the sent entries taken out
    kernels::clear_at(idx, x);
    copy(x, residual_.view(res_at_[b], Shape{n}));
  }
  const int world = comm_.size();
  Tensor all_idx = scratch(k * world, DType::i32), all_val = scratch(k * world, DType::f32);
  comm_.all_gather(idx, all_idx);
  comm_.all_gather(val, all_val);
  // From -0, the identity of IEEE addition (-0 + x is x, even for x = -0), so that at
  // ratio 1 the sum is exactly an all-reduce's; the ranks' pairs added in rank order.
  Tensor sum = scratch(n, DType::f32);
  kernels::fill(sum, -0.0f);
  kernels::scatter_add(all_idx, all_val, k, sum);
  unpack(p.compressed, sum, grads);
  tally_.sent += static_cast<uint64_t>(k) * 8;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::onebit(size_t b, const BucketPlan& p, Tensor& grads) {
  const int64_t n = total(p.compressed);
  Tensor x = input(p.compressed, grads, res_at_[b]);
  const int64_t nwords = (n + 31) / 32, nchunks = (n + kSignChunk - 1) / kSignChunk;
  Tensor words = scratch(nwords, DType::i32), scales = scratch(nchunks, DType::f32);
  kernels::sign_pack(x, kSignChunk, words, scales);
  if (o_.error_feedback) {  // residual = x - what this rank's bits and scales stand for
    Tensor mine = scratch(n, DType::f32);
    kernels::sign_unpack(words, scales, kSignChunk, mine, false);
    kernels::axpy(-1.0f, mine, x);
    copy(x, residual_.view(res_at_[b], Shape{n}));
  }
  const int world = comm_.size();
  Tensor all_words = scratch(nwords * world, DType::i32);
  Tensor all_scales = scratch(nchunks * world, DType::f32);
  comm_.all_gather(words, all_words);
  comm_.all_gather(scales, all_scales);
  Tensor sum = scratch(n, DType::f32);
  for (int r = 0; r < world; ++r) {  // rank order: the same bits on every rank
    kernels::sign_unpack(all_words.view(r * nwords, Shape{nwords}),
                         all_scales.view(r * nchunks, Shape{nchunks}), kSignChunk, sum, r > 0);
  }
  unpack(p.compressed, sum, grads);
  tally_.sent += static_cast<uint64_t>(nwords + nchunks) * 4;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::powersgd(size_t b, const BucketPlan& p, Tensor& grads) {
  using kernels::GemmArgs;
  using kernels::Trans;
  // Every matrix's M (with its residual), then all P's in one buffer, all Q's in another.
  std::vector<Tensor> ms;
  std::vector<int64_t> res_lo;  // each matrix's part of the compact residual
  int64_t p_elems = 0, q_elems = 0, r = res_at_[b];
  for (const Piece& m : p.compressed) {
    res_lo.push_back(r);
    r += m.hi - m.lo;
    ms.push_back(input({m}, grads, res_lo.back()).view(0, Shape{m.rows, m.cols}));
    p_elems += m.rows * rank_of(o_, m);
    q_elems += m.cols * rank_of(o_, m);
  }
  Tensor ps = scratch(p_elems, DType::f32), qs = scratch(q_elems, DType::f32);
  int64_t at = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // P = M Q (Q from the last step)
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    GemmArgs args;
    args.m = m.rows, args.n = q, args.k = m.cols;
    gemm(args, ms[i], q_.view(q_at_[b][i], Shape{m.cols, q}), ps.view(at, Shape{m.rows, q}));
    at += m.rows * q;
  }
  comm_.all_reduce(ps, dist::ReduceOp::sum, dense_algo_);
  at = 0;
  int64_t qt = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // orthonormal P, then Q = M^T P
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    Tensor pm = ps.view(at, Shape{m.rows, q}), qm = qs.view(qt, Shape{m.cols, q});
    kernels::orthonormalize_columns(pm);
    GemmArgs args;
    args.trans_a = Trans::yes;
    args.m = m.cols, args.n = q, args.k = m.rows;
    gemm(args, ms[i], pm, qm);
    if (o_.error_feedback) {  // residual = M - P Q_mine^T: what this rank's Q leaves out
      Tensor approx = scratch(m.rows * m.cols, DType::f32);
      GemmArgs outer;
      outer.trans_b = Trans::yes;
      outer.m = m.rows, outer.n = m.cols, outer.k = q;
      gemm(outer, pm, qm, approx.view(0, Shape{m.rows, m.cols}));
      kernels::axpy(-1.0f, approx, ms[i]);
      copy(ms[i], residual_.view(res_lo[i], Shape{m.rows, m.cols}));
    }
    at += m.rows * q;
    qt += m.cols * q;
  }
  comm_.all_reduce(qs, dist::ReduceOp::sum, dense_algo_);
  at = 0;
  qt = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // the sum: P Q^T; Q kept for next time
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    Tensor qm = qs.view(qt, Shape{m.cols, q});
    copy(qm, q_.view(q_at_[b][i], Shape{m.cols, q}));
    GemmArgs outer;
    outer.trans_b = Trans::yes;
    outer.m = m.rows, outer.n = m.cols, outer.k = q;
    gemm(outer, ps.view(at, Shape{m.rows, q}), qm, grads.view(m.lo, Shape{m.rows, m.cols}));
    at += m.rows * q;
    qt += m.cols * q;
  }
  tally_.sent += static_cast<uint64_t>(p_elems + q_elems) * 4;
  tally_.dense += static_cast<uint64_t>(total(p.compressed)) * 4;
}

Tally Compressor::take_tally() {
  const Tally t = tally_;
  tally_ = Tally{};
  return t;
}

Tally bytes_per_step(const CompressOptions& o, const std::vector<BucketPlan>& plans) {
  Tally t;
  for (const BucketPlan& p : plans) {
    const auto dense = static_cast<uint64_t>(total(p.dense)) * 4;
    t.sent += dense;
    t.dense += dense + static_cast<uint64_t>(total(p.compressed)) * 4;
    const int64_t n = total(p.compressed);
    if (n == 0) continue;
    switch (o.method) {
      case CompressMethod::topk:
        t.sent += static_cast<uint64_t>(
                      std::clamp<int64_t>(std::llround(o.ratio * static_cast<double>(n)), 1, n)) *
                  8;
        break;
      case CompressMethod::onebit:
        t.sent += static_cast<uint64_t>((n + 31) / 32 + (n + kSignChunk - 1) / kSignChunk) * 4;
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
  const double n = world, reduce = 2.0 * (n - 1) / n, gather = n - 1;  // per byte sent
  double bus = 0;
  for (const BucketPlan& p : plans) {
    bus += reduce * 4.0 * static_cast<double>(total(p.dense));
    const int64_t c = total(p.compressed);
    if (c == 0) continue;
    switch (o.method) {
      case CompressMethod::topk:  // indices and values: 8 bytes an entry, gathered
        bus += gather * 8.0 *
               static_cast<double>(
                   std::clamp<int64_t>(std::llround(o.ratio * static_cast<double>(c)), 1, c));
        break;
      case CompressMethod::onebit:  // sign words and chunk scales, gathered
        bus +=
            gather * 4.0 * static_cast<double>((c + 31) / 32 + (c + kSignChunk - 1) / kSignChunk);
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
