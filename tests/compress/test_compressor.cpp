// Gradient compression's arithmetic on one rank (the self communicator: what a rank
// sends is then what comes back): the kernels on hand-computed inputs, the
// error-feedback invariant step by step and over many steps, top-k at ratio 1 and
// PowerSGD at full rank giving back the gradient, and the bucket plan. Several ranks
// are tested through training (tests/train/test_data_parallel.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "compress/compressor.h"
#include "core/rng.h"
#include "kernels/compress.h"

using namespace dtrain;
using namespace dtrain::compress;

namespace {

// Two matrices (16 x 96, 40 x 32) and a bias (24) laid out as a flat gradient, in one
// bucket, or (split) in two from the end as dist::plan_buckets cuts them.
struct Layout {
  std::vector<ParamInfo> params = {{0, 16 * 96, 16}, {1536, 40 * 32, 40}, {2816, 24, 0}};
  int64_t total = 2816 + 32;
  bool split = false;
  std::vector<dist::Bucket> buckets() const {
    if (split) return {{1536, total, {2, 1}, {}}, {0, 1536, {0}, {}}};
    return {{0, total, {2, 1, 0}, {}}};
  }
};

std::vector<float> gradient(uint64_t step, int64_t n) {
  const Philox rng(11, step);
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = rng.normal(static_cast<uint64_t>(i));
  return g;
}

// The residual (compact: the compressed pieces one after another, in layout order)
// spread over the layout, -0 where nothing compresses.
std::vector<float> residual_by_layout(const Compressor& c, int64_t total) {
  std::vector<Piece> pieces;
  for (const BucketPlan& p : c.plans())
    pieces.insert(pieces.end(), p.compressed.begin(), p.compressed.end());
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.lo < b.lo; });
  std::vector<float> out(static_cast<size_t>(total), -0.0f);
  const Tensor r = c.residual();
  int64_t at = 0;
  for (const Piece& m : pieces)
    for (int64_t i = m.lo; i < m.hi; ++i) out[static_cast<size_t>(i)] = r.data<float>()[at++];
  CHECK(at == r.numel());
  return out;
}

Compressor make(const CompressOptions& o, dist::Communicator& comm, const Layout& l) {
  return Compressor(o, comm, plan_compression(o, l.buckets(), l.params, 1024), l.total,
                    AllreduceAlgo::ring, 5);
}

}  // namespace

// The same kernels against fp64 references, on the CPU and CUDA: the kernel table's
// "compress" family (tests/kernels/cases_compress.cpp). Here: hand-computed results.
TEST_CASE("kernels: top-k by magnitude with ties to the lower index") {
  std::vector<float> x = {1.0f, -3.0f, 3.0f, 2.0f, -0.5f};
  std::vector<int32_t> idx(3);
  std::vector<float> val(3);
  const Tensor tx = Tensor::wrap(x.data(), Shape{5}, DType::f32);
  Tensor i1 = Tensor::wrap(idx.data(), Shape{1}, DType::i32);
  Tensor v1 = Tensor::wrap(val.data(), Shape{1}, DType::f32);
  std::vector<std::byte> scratch(kernels::topk_workspace_bytes(5));
  const kernels::Workspace w{scratch.data(), scratch.size()};
  kernels::topk_select(tx, i1, v1, w);
  CHECK(idx[0] == 1);
  CHECK(val[0] == -3.0f);
  Tensor i3 = Tensor::wrap(idx.data(), Shape{3}, DType::i32);
  Tensor v3 = Tensor::wrap(val.data(), Shape{3}, DType::f32);
  kernels::topk_select(tx, i3, v3, w);
  CHECK(idx == std::vector<int32_t>{1, 2, 3});
  CHECK(val == std::vector<float>{-3.0f, 3.0f, 2.0f});
}

TEST_CASE("kernels: 1-bit packing of a known vector, and back") {
  std::vector<float> x = {1.0f, -2.0f, 0.0f, -0.0f, 3.0f};
  std::vector<int32_t> words(1);
  std::vector<float> scales(3), out(5);
  Tensor tw = Tensor::wrap(words.data(), Shape{1}, DType::i32);
  Tensor ts = Tensor::wrap(scales.data(), Shape{3}, DType::f32);
  kernels::sign_pack(Tensor::wrap(x.data(), Shape{5}, DType::f32), 2, tw, ts);
  CHECK(words[0] == 0b11101);  // element i is bit i: +, -, +, + (-0 counts as +), +
  CHECK(scales[0] == 1.5f);    // mean |x| per chunk of 2
  CHECK(scales[1] == 0.0f);
  CHECK(scales[2] == 3.0f);
  Tensor to = Tensor::wrap(out.data(), Shape{5}, DType::f32);
  kernels::sign_unpack(tw, ts, 2, to, false);
  CHECK(out == std::vector<float>{1.5f, -1.5f, 0.0f, 0.0f, 3.0f});
  kernels::sign_unpack(tw, ts, 2, to, true);
  CHECK(out == std::vector<float>{3.0f, -3.0f, 0.0f, 0.0f, 6.0f});
}

TEST_CASE("kernels: orthonormal columns") {
  std::vector<float> a = gradient(3, 12 * 4);
  Tensor ta = Tensor::wrap(a.data(), Shape{12, 4}, DType::f32);
  kernels::orthonormalize_columns(ta);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      double dot = 0;
      for (int r = 0; r < 12; ++r) dot += static_cast<double>(a[r * 4 + i]) * a[r * 4 + j];
      CHECK(std::fabs(dot - (i == j ? 1.0 : 0.0)) < 1e-5);
    }
}

TEST_CASE("the plan compresses large 2-D tensors, PowerSGD only where its factors are smaller") {
  const Layout l;
  CompressOptions o;
  o.method = CompressMethod::topk;
  std::vector<BucketPlan> p = plan_compression(o, l.buckets(), l.params, 1024);
  REQUIRE(p.size() == 1);
  CHECK(p[0].compressed.size() == 2);
  CHECK(p[0].dense.size() == 1);  // the bias
  CHECK(p[0].compressed[1].rows == 40);
  CHECK(p[0].compressed[1].cols == 32);
  o.method = CompressMethod::powersgd;
  o.rank = 16;  // 16 x (40 + 32) > 40 x 32: that matrix stays dense
  p = plan_compression(o, l.buckets(), l.params, 1024);
  CHECK(p[0].compressed.size() == 1);
  CHECK(p[0].dense.size() == 2);
}

// Error feedback: what a rank sent plus its residual is what it had to send, each step
// exactly for top-k (an entry is either sent or kept), and over 20 steps the sent sums
// plus the last residual are the gradients' sum (to rounding) for every method; in one
// bucket and in two (the residual is in layout order either way).
TEST_CASE("error feedback: sent + residual = the gradients, per step and over many steps") {
  auto self = dist::make_self_communicator();
  for (const auto& [m, split] :
       std::vector<std::pair<CompressMethod, bool>>{{CompressMethod::topk, false},
                                                    {CompressMethod::onebit, false},
                                                    {CompressMethod::powersgd, false},
                                                    {CompressMethod::topk, true},
                                                    {CompressMethod::powersgd, true}}) {
    CAPTURE(to_string(m));
    CAPTURE(split);
    Layout l;
    l.split = split;
    CompressOptions o;
    o.method = m;
    o.ratio = 0.05;
    o.rank = 2;
    Compressor c = make(o, *self, l);
    std::vector<double> sum_g(static_cast<size_t>(l.total)), sum_sent(sum_g.size());
    std::vector<float> prev(static_cast<size_t>(l.total), 0.0f);
    double scale = 0;
    for (uint64_t t = 0; t < 20; ++t) {
      std::vector<float> g = gradient(t, l.total);
      std::vector<float> x(g.size());
      for (size_t i = 0; i < g.size(); ++i) {
        sum_g[i] += g[i];
        x[i] = g[i] + prev[i];  // what this step had to send, residual included
        scale = std::max(scale, std::fabs(static_cast<double>(g[i])));
      }
      Tensor gt = Tensor::wrap(g.data(), Shape{l.total}, DType::f32);
      for (size_t b = 0; b < l.buckets().size(); ++b)
        c.reduce(b, gt);  // one rank: g now holds what this rank sent
      const std::vector<float> r = residual_by_layout(c, l.total);
      for (size_t i = 0; i < g.size(); ++i) sum_sent[i] += g[i];
      if (m == CompressMethod::topk) {
        size_t exact = 0;
        for (size_t i = 0; i < g.size(); ++i) exact += g[i] + r[i] == x[i] ? 1 : 0;
        CHECK(exact == g.size());
      }
      prev = r;
    }
    double worst = 0;
    for (size_t i = 0; i < sum_g.size(); ++i)
      worst = std::max(worst, std::fabs(sum_sent[i] + prev[i] - sum_g[i]));
    CHECK(worst < 1e-4 * scale * 20);
    const Tally tally = c.take_tally();
    CHECK(tally.sent < tally.dense / 4);  // compressed: the bias alone travels dense
    CHECK(tally.dense == 20 * static_cast<uint64_t>(16 * 96 + 40 * 32 + 24) * 4);
  }
}

// The residual holds the compressed pieces only (the bias travels dense), and nothing
// without error feedback, where a step still reduces.
TEST_CASE("the residual holds the compressed pieces only, none without error feedback") {
  const Layout l;
  auto self = dist::make_self_communicator();
  for (bool feedback : {true, false}) {
    CAPTURE(feedback);
    CompressOptions o;
    o.method = CompressMethod::topk;
    o.ratio = 0.05;
    o.error_feedback = feedback;
    Compressor c = make(o, *self, l);
    const int64_t compressed = 16 * 96 + 40 * 32;
    CHECK(residual_elems(o, c.plans()) == (feedback ? compressed : 0));
    CHECK(c.residual().numel() == residual_elems(o, c.plans()));
    std::vector<float> g = gradient(0, l.total);
    Tensor gt = Tensor::wrap(g.data(), Shape{l.total}, DType::f32);
    c.reduce(0, gt);
    int64_t sent = 0;
    for (int64_t i = 0; i < compressed; ++i) sent += g[static_cast<size_t>(i)] != 0.0f ? 1 : 0;
    CHECK(sent > 0);
    CHECK(sent <= compressed / 10);  // 5% of each bucket's compressed entries, rounded
  }
}

TEST_CASE("top-k at ratio 1 and PowerSGD at full rank give the gradient back") {
  const Layout l;
  auto self = dist::make_self_communicator();
  CompressOptions o;
  o.method = CompressMethod::topk;
  o.ratio = 1.0;
  Compressor c = make(o, *self, l);
  std::vector<float> g = gradient(4, l.total), want = g;
  g[5] = want[5] = -0.0f;  // a negative zero survives: sums start from -0
  c.reduce(0, Tensor::wrap(g.data(), Shape{l.total}, DType::f32));
  CHECK(std::memcmp(g.data(), want.data(), g.size() * 4) == 0);
  CHECK(std::signbit(g[5]));

  // Full rank, forced: a plan compressing the 16 x 96 matrix at rank 16.
  o.method = CompressMethod::powersgd;
  o.rank = 16;
  BucketPlan plan;
  plan.compressed.push_back({0, 16 * 96, 16, 96});
  plan.dense.push_back({1536, 2816 + 24, 1, 2816 + 24 - 1536});
  Compressor p(o, *self, {plan}, l.total, AllreduceAlgo::ring, 5);
  g = want;
  p.reduce(0, Tensor::wrap(g.data(), Shape{l.total}, DType::f32));
  double worst = 0;
  for (size_t i = 0; i < 16 * 96; ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(g[i] - want[i])));
  CHECK(worst < 1e-4);
  CHECK(std::memcmp(g.data() + 1536, want.data() + 1536, (2816 + 24 - 1536) * 4) == 0);
}
