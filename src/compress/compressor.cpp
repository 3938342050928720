// See compressor.h.
#include "compress/compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/compress.h"

namespace dtrain::compress {

namespace {

constexpr int64_t kSignChunk = 1024;
constexpr uint32_t kPowerSgdPurpose = 7;  // Philox stream of the initial Q

int64_t total(const std::vector<Piece>& pieces) {
  int64_t n = 0;
  for (const Piece& p : pieces) n += p.hi - p.lo;
  return n;
}

// The pieces' elements of `flat`, one after another, into `out` (and back).
void pack(const std::vector<Piece>& pieces, const float* flat, float* out) {
  for (const Piece& p : pieces) {
    std::memcpy(out, flat + p.lo, static_cast<size_t>(p.hi - p.lo) * sizeof(float));
    out += p.hi - p.lo;
  }
}
void unpack(const std::vector<Piece>& pieces, const float* in, float* flat) {
  for (const Piece& p : pieces) {
    std::memcpy(flat + p.lo, in, static_cast<size_t>(p.hi - p.lo) * sizeof(float));
    in += p.hi - p.lo;
  }
}

Tensor host(std::vector<float>& v) {
  return Tensor::wrap(v.data(), Shape{static_cast<int64_t>(v.size())}, DType::f32);
}

// c[r, q] = a[r, k] b[k, q] (trans_a: a is [k, r]); f32, in a fixed order.
void matmul(const float* a, const float* b, float* c, int64_t r, int64_t k, int64_t q,
            bool trans_a) {
  std::fill(c, c + r * q, 0.0f);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t l = 0; l < k; ++l) {
      const float x = trans_a ? a[l * r + i] : a[i * k + l];
      for (int64_t j = 0; j < q; ++j) c[i * q + j] += x * b[l * q + j];
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

Compressor::Compressor(const CompressOptions& o, dist::Communicator& comm,
                       std::vector<BucketPlan> plans, int64_t layout_elems,
                       AllreduceAlgo dense_algo, uint64_t seed)
    : o_(o), comm_(comm), plans_(std::move(plans)), dense_algo_(dense_algo) {
  DTRAIN_CHECK(o.method != CompressMethod::none, "a compressor without a method");
  // -0: adding it changes no value, not even a -0 gradient (x + +0 would turn -0 into
  // +0), so an empty residual leaves the gradient's bits as they are.
  residual_ = Tensor::empty(Shape{layout_elems}, DType::f32);
  std::fill(residual_.data<float>(), residual_.data<float>() + layout_elems, -0.0f);
  if (o.method != CompressMethod::powersgd) return;
  int64_t n = 0;
  for (const BucketPlan& p : plans_) {
    q_at_.emplace_back();
    for (const Piece& m : p.compressed) {
      q_at_.back().push_back(n);
      n += m.cols * rank_of(o_, m);
    }
  }
  q_ = Tensor::empty(Shape{std::max<int64_t>(n, 1)}, DType::f32);
  const Philox rng(seed, rng_stream_id(kPowerSgdPurpose, 0, 0));  // the same Q on every rank
  for (int64_t i = 0; i < q_.numel(); ++i)
    q_.data<float>()[i] = rng.normal(static_cast<uint64_t>(i));
}

void Compressor::reduce(size_t b, Tensor grads) {
  DTRAIN_CHECK(
      grads.device().is_cpu() && grads.dtype() == DType::f32 && grads.numel() == residual_.numel(),
      "compression of {} (host f32 [{}] expected)", grads.str(), residual_.numel());
  const BucketPlan& p = plans_.at(b);
  float* g = grads.data<float>();
  if (!p.compressed.empty()) {
    switch (o_.method) {
      case CompressMethod::topk:
        topk(p, g);
        break;
      case CompressMethod::onebit:
        onebit(p, g);
        break;
      case CompressMethod::powersgd:
        powersgd(b, p, g);
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
  std::vector<float> buf(static_cast<size_t>(n));
  pack(p.dense, grads.data<float>(), buf.data());
  comm_.all_reduce(host(buf), dist::ReduceOp::sum, dense_algo_);
  unpack(p.dense, buf.data(), grads.data<float>());
  tally_.sent += static_cast<uint64_t>(n) * 4;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

// The compressed pieces' gradient, one after another, with this rank's residual added.
std::vector<float> Compressor::input(const std::vector<Piece>& pieces, const float* g) const {
  const int64_t n = total(pieces);
  std::vector<float> x(static_cast<size_t>(n)), res(static_cast<size_t>(n));
  pack(pieces, g, x.data());
  if (o_.error_feedback) {
    pack(pieces, residual_.data<float>(), res.data());
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] += res[static_cast<size_t>(i)];
  }
  return x;
}

void Compressor::topk(const BucketPlan& p, float* g) {
  const int64_t n = total(p.compressed);
  std::vector<float> x = input(p.compressed, g);
  const int64_t k = std::clamp<int64_t>(std::llround(o_.ratio * static_cast<double>(n)), 1, n);
  std::vector<int32_t> idx(static_cast<size_t>(k));
  std::vector<float> val(static_cast<size_t>(k));
  kernels::topk_select(x.data(), n, k, idx.data(), val.data());
  if (o_.error_feedback) {  // what was not sent: x with the sent entries taken out
    for (int64_t j = 0; j < k; ++j) x[static_cast<size_t>(idx[static_cast<size_t>(j)])] = -0.0f;
    unpack(p.compressed, x.data(), residual_.data<float>());
  }
  const int world = comm_.size();
  std::vector<int32_t> all_idx(static_cast<size_t>(k) * static_cast<size_t>(world));
  std::vector<float> all_val(all_idx.size());
  Tensor ti = Tensor::wrap(idx.data(), Shape{k}, DType::i32);
  Tensor to = Tensor::wrap(all_idx.data(), Shape{k * world}, DType::i32);
  comm_.all_gather(ti, to);
  Tensor tv = host(val), tw = host(all_val);
  comm_.all_gather(tv, tw);
  // From -0, the identity of IEEE addition (-0 + x is x, even for x = -0), so that at
  // ratio 1 the sum is exactly an all-reduce's.
  std::vector<float> sum(static_cast<size_t>(n), -0.0f);
  for (size_t j = 0; j < all_idx.size(); ++j)  // rank order: the same bits on every rank
    sum[static_cast<size_t>(all_idx[j])] += all_val[j];
  unpack(p.compressed, sum.data(), g);
  tally_.sent += static_cast<uint64_t>(k) * 8;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::onebit(const BucketPlan& p, float* g) {
  const int64_t n = total(p.compressed);
  std::vector<float> x = input(p.compressed, g);
  const int64_t nwords = (n + 31) / 32, nchunks = (n + kSignChunk - 1) / kSignChunk;
  std::vector<uint32_t> words(static_cast<size_t>(nwords));
  std::vector<float> scales(static_cast<size_t>(nchunks));
  kernels::sign_pack(x.data(), n, kSignChunk, words.data(), scales.data());
  if (o_.error_feedback) {  // residual = x - what this rank's bits and scales stand for
    std::vector<float> mine(static_cast<size_t>(n));
    kernels::sign_unpack(words.data(), scales.data(), n, kSignChunk, mine.data(), false);
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] -= mine[static_cast<size_t>(i)];
    unpack(p.compressed, x.data(), residual_.data<float>());
  }
  const int world = comm_.size();
  std::vector<uint32_t> all_words(static_cast<size_t>(nwords * world));
  std::vector<float> all_scales(static_cast<size_t>(nchunks * world));
  Tensor tw = Tensor::wrap(words.data(), Shape{nwords}, DType::i32);
  Tensor taw = Tensor::wrap(all_words.data(), Shape{nwords * world}, DType::i32);
  comm_.all_gather(tw, taw);
  Tensor ts = host(scales), tas = host(all_scales);
  comm_.all_gather(ts, tas);
  std::vector<float> sum(static_cast<size_t>(n));
  for (int r = 0; r < world; ++r) {
    kernels::sign_unpack(all_words.data() + r * nwords, all_scales.data() + r * nchunks, n,
                         kSignChunk, sum.data(), r > 0);
  }
  unpack(p.compressed, sum.data(), g);
  tally_.sent += static_cast<uint64_t>(nwords + nchunks) * 4;
  tally_.dense += static_cast<uint64_t>(n) * 4;
}

void Compressor::powersgd(size_t b, const BucketPlan& p, float* g) {
  // Every matrix's M (with its residual), then all P's in one buffer, all Q's in another.
  std::vector<std::vector<float>> ms;
  int64_t p_elems = 0, q_elems = 0;
  for (const Piece& m : p.compressed) {
    ms.emplace_back(static_cast<size_t>(m.hi - m.lo));
    std::vector<float>& x = ms.back();
    std::memcpy(x.data(), g + m.lo, x.size() * sizeof(float));
    if (o_.error_feedback) {
      const float* r = residual_.data<float>() + m.lo;
      for (size_t i = 0; i < x.size(); ++i) x[i] += r[i];
    }
    p_elems += m.rows * rank_of(o_, m);
    q_elems += m.cols * rank_of(o_, m);
  }
  std::vector<float> ps(static_cast<size_t>(p_elems)), qs(static_cast<size_t>(q_elems));
  float* q_state = q_.data<float>();
  int64_t at = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // P = M Q (Q from the last step)
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    matmul(ms[i].data(), q_state + q_at_[b][i], ps.data() + at, m.rows, m.cols, q, false);
    at += m.rows * q;
  }
  comm_.all_reduce(host(ps), dist::ReduceOp::sum, dense_algo_);
  at = 0;
  int64_t qt = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // orthonormal P, then Q = M^T P
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    kernels::orthonormalize_columns(ps.data() + at, m.rows, q);
    matmul(ms[i].data(), ps.data() + at, qs.data() + qt, m.cols, m.rows, q, true);
    if (o_.error_feedback) {  // residual = M - P Q_mine^T: what this rank's Q leaves out
      std::vector<float> approx(static_cast<size_t>(m.rows * m.cols));
      // (P Q^T)[r, c] = sum_j P[r, j] Q[c, j]
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) {
          float s = 0;
          for (int64_t j = 0; j < q; ++j)
            s += ps[static_cast<size_t>(at + r * q + j)] * qs[static_cast<size_t>(qt + c * q + j)];
          approx[static_cast<size_t>(r * m.cols + c)] = s;
        }
      float* res = residual_.data<float>() + m.lo;
      for (size_t e = 0; e < approx.size(); ++e) res[e] = ms[i][e] - approx[e];
    }
    at += m.rows * q;
    qt += m.cols * q;
  }
  comm_.all_reduce(host(qs), dist::ReduceOp::sum, dense_algo_);
  at = 0;
  qt = 0;
  for (size_t i = 0; i < p.compressed.size(); ++i) {  // the sum: P Q^T; Q kept for next time
    const Piece& m = p.compressed[i];
    const int64_t q = rank_of(o_, m);
    std::memcpy(q_state + q_at_[b][i], qs.data() + qt, static_cast<size_t>(m.cols * q) * 4);
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) {
        float s = 0;
        for (int64_t j = 0; j < q; ++j)
          s += ps[static_cast<size_t>(at + r * q + j)] * qs[static_cast<size_t>(qt + c * q + j)];
        g[m.lo + r * m.cols + c] = s;
      }
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

}  // namespace dtrain::compress
