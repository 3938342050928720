// Gradient compression across ranks (ctest runs it under mpirun on 3 ranks, label
// mpi): the two-phase exchange of top-k and 1-bit (compress.exchange two_phase) and
// the all-gather (gather) side by side. Over many steps, what arrives plus every
// rank's residual and every owner's server residual is the sum of every rank's
// gradients; every rank holds the same bits; top-k at ratio 1 is the exact sum in rank
// order; the bytes a rank sends and the bus bytes the communicator counts are what
// bytes_per_step and bus_bytes_per_step say; pipelined exchanges (two buckets in flight)
// give the bits of one at a time.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "compress/compressor.h"
#include "core/rng.h"
#include "mpi_world.h"

using namespace dtrain;
using namespace dtrain::compress;

namespace {

// A 40 x 97 matrix (its 3880 elements cut unevenly into 3 segments), a 16 x 96 one and a
// bias, in two buckets (the bias and the first matrix; the second matrix).
const std::vector<ParamInfo> kParams = {{0, 40 * 97, 40}, {3880, 16 * 96, 16}, {5416, 24, 0}};
constexpr int64_t kTotal = 5440;
std::vector<dist::Bucket> buckets() { return {{3880, kTotal, {2, 1}, {}}, {0, 3880, {0}, {}}}; }

std::vector<float> gradient(int rank, uint64_t step) {
  const Philox rng(17, (step << 8) + static_cast<uint64_t>(rank));
  std::vector<float> g(static_cast<size_t>(kTotal));
  for (int64_t i = 0; i < kTotal; ++i)
    g[static_cast<size_t>(i)] = rng.normal(static_cast<uint64_t>(i));
  return g;
}

// Every rank's copy of `v` (the same length on every rank), rank after rank.
std::vector<float> gather_all(dist::Communicator& comm, const Tensor& v) {
  std::vector<float> out(static_cast<size_t>(v.numel() * comm.size()));
  Tensor o = Tensor::wrap(out.data(), Shape{v.numel() * comm.size()}, DType::f32);
  std::vector<float> mine(v.data<float>(), v.data<float>() + v.numel());
  comm.all_gather(Tensor::wrap(mine.data(), Shape{v.numel()}, DType::f32), o);
  return out;
}

// Every rank's server residual spread over the layout: rank r's holds its segment of
// each bucket's compressed elements (packed in plan order), bucket after bucket.
std::vector<double> servers_by_layout(dist::Communicator& comm, const CompressOptions& o,
                                      const Compressor& c) {
  const int world = comm.size();
  std::vector<int64_t> counts;
  for (int r = 0; r < world; ++r) counts.push_back(server_residual_elems(o, c.plans(), world, r));
  int64_t all = 0, at = 0;
  for (int r = 0; r < world; ++r) {
    if (r < comm.rank()) at += counts[static_cast<size_t>(r)];
    all += counts[static_cast<size_t>(r)];
  }
  std::vector<float> flat(static_cast<size_t>(all));
  const Tensor mine = c.server_residual();
  REQUIRE(mine.numel() == counts[static_cast<size_t>(comm.rank())]);
  std::copy(mine.data<float>(), mine.data<float>() + mine.numel(), flat.begin() + at);
  comm.all_gatherv_async(Tensor::wrap(flat.data(), Shape{all}, DType::f32), counts).wait();
  std::vector<double> out(static_cast<size_t>(kTotal), 0.0);
  int64_t from = 0;
  for (int r = 0; r < world; ++r) {
    for (const BucketPlan& p : c.plans()) {
      std::vector<int64_t> where;  // the layout position of each packed element
      for (const Piece& m : p.compressed)
        for (int64_t i = m.lo; i < m.hi; ++i) where.push_back(i);
      const auto e = static_cast<int64_t>(where.size());
      const int64_t lo = e * r / world, hi = e * (r + 1) / world;
      for (int64_t i = lo; i < hi; ++i)
        out[static_cast<size_t>(where[static_cast<size_t>(i)])] = flat[static_cast<size_t>(from++)];
    }
  }
  CHECK(from == all);
  return out;
}

// The residual (compact, the compressed pieces in layout order) spread over the layout.
std::vector<double> residual_by_layout(const std::vector<BucketPlan>& plans, const float* r) {
  std::vector<Piece> pieces;
  for (const BucketPlan& p : plans)
    pieces.insert(pieces.end(), p.compressed.begin(), p.compressed.end());
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.lo < b.lo; });
  std::vector<double> out(static_cast<size_t>(kTotal), 0.0);
  int64_t at = 0;
  for (const Piece& m : pieces)
    for (int64_t i = m.lo; i < m.hi; ++i) out[static_cast<size_t>(i)] = r[at++];
  return out;
}

}  // namespace

TEST_CASE("two-phase and gathered exchanges: arrived + residuals = the gradients' sum") {
  dist::Communicator& comm = test_world();
  const int world = comm.size(), me = comm.rank();
  for (const CompressMethod method : {CompressMethod::topk, CompressMethod::onebit}) {
    for (const CompressExchange exchange :
         {CompressExchange::two_phase, CompressExchange::gather}) {
      CAPTURE(to_string(method));
      CAPTURE(to_string(exchange));
      CompressOptions o;
      o.method = method;
      o.ratio = 0.05;
      o.exchange = exchange;
      std::vector<BucketPlan> plans = plan_compression(o, buckets(), kParams, 1024);
      Compressor c(o, comm, plans, kTotal, AllreduceAlgo::ring, 5);
      CHECK(c.exchange() == exchange);
      CHECK((c.server_residual().numel() > 0) == (exchange == CompressExchange::two_phase));
      std::vector<double> want(static_cast<size_t>(kTotal), 0.0), got(want.size(), 0.0);
      double scale = 0;
      const int steps = 12;
      for (int t = 0; t < steps; ++t) {
        for (int r = 0; r < world; ++r) {
          const std::vector<float> g = gradient(r, static_cast<uint64_t>(t));
          for (size_t i = 0; i < g.size(); ++i) {
            want[i] += g[i];
            scale = std::max(scale, std::fabs(static_cast<double>(g[i])));
          }
        }
        std::vector<float> g = gradient(me, static_cast<uint64_t>(t));
        Tensor gt = Tensor::wrap(g.data(), Shape{kTotal}, DType::f32);
        const dist::CommStats before = comm.stats();
        c.start(0, gt);
        c.complete();
        c.start(1, gt);
        c.complete();
        const dist::CommStats after = comm.stats();
        // The communicator's bus bytes for the step are what the estimate uses.
        const double bus = bus_bytes_per_step(o, plans, world);
        CHECK(std::fabs(after.bus_bytes - before.bus_bytes - bus) <= 1e-9 * bus);
        const Tally tally = c.take_tally();
        if (me == 0) CHECK(tally.sent == bytes_per_step(o, plans, world).sent);
        CHECK(tally.dense == static_cast<uint64_t>(kTotal) * 4);
        // Every rank holds the same bits.
        const std::vector<float> all = gather_all(comm, gt);
        for (int r = 1; r < world; ++r)
          CHECK(std::memcmp(all.data(), all.data() + static_cast<size_t>(r) * g.size(),
                            g.size() * sizeof(float)) == 0);
        for (size_t i = 0; i < g.size(); ++i) got[i] += g[i];
      }
      // What has not arrived yet: every rank's residual and every owner's server residual.
      const Tensor res = c.residual();
      const std::vector<float> residuals = gather_all(comm, res);
      std::vector<double> held(static_cast<size_t>(kTotal), 0.0);
      for (int r = 0; r < world; ++r) {
        const std::vector<double> one =
            residual_by_layout(plans, residuals.data() + static_cast<size_t>(r * res.numel()));
        for (size_t i = 0; i < held.size(); ++i) held[i] += one[i];
      }
      if (exchange == CompressExchange::two_phase) {
        const std::vector<double> servers = servers_by_layout(comm, o, c);
        for (size_t i = 0; i < held.size(); ++i) held[i] += servers[i];
      }
      double worst = 0, moved = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] + held[i] - want[i]));
        moved = std::max(moved, std::fabs(got[i]));
      }
      MESSAGE(to_string(method), " ", to_string(exchange), ": worst ", worst, " of scale ", scale);
      CHECK(moved > 0);
      CHECK(worst < 1e-6 * scale * steps * world);
    }
  }
}

// Pipelined, as dist::GradSync runs it (advance() before each start(), so that a bucket's
// second collective runs while the next bucket starts): the same bits as one bucket at a
// time, in the gradients, the residuals, the server residuals and PowerSGD's Q. Three
// buckets (the second matrix, the first, the bias), so that two buckets with a second
// collective are in flight at once, and one without follows.
TEST_CASE("pipelined exchanges give the bits of one bucket at a time") {
  dist::Communicator& comm = test_world();
  const int me = comm.rank();
  const std::vector<dist::Bucket> three = {
      {3880, 5416, {1}, {}}, {0, 3880, {0}, {}}, {5416, kTotal, {2}, {}}};
  struct Way {
    CompressMethod method;
    CompressExchange exchange;
  };
  for (const Way way : {Way{CompressMethod::topk, CompressExchange::two_phase},
                        Way{CompressMethod::onebit, CompressExchange::two_phase},
                        Way{CompressMethod::powersgd, CompressExchange::auto_},
                        Way{CompressMethod::topk, CompressExchange::gather}}) {
    CAPTURE(to_string(way.method));
    CAPTURE(to_string(way.exchange));
    CompressOptions o;
    o.method = way.method;
    o.ratio = 0.05;
    o.exchange = way.exchange;
    const std::vector<BucketPlan> plans = plan_compression(o, three, kParams, 1024);
    REQUIRE(plans[0].compressed.size() == 1);
    REQUIRE(plans[1].compressed.size() == 1);
    REQUIRE(plans[2].compressed.empty());
    Compressor piped(o, comm, plans, kTotal, AllreduceAlgo::ring, 5);
    Compressor alone(o, comm, plans, kTotal, AllreduceAlgo::ring, 5);
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g = gradient(me, static_cast<uint64_t>(step)), h = g;
      Tensor gt = Tensor::wrap(g.data(), Shape{kTotal}, DType::f32);
      Tensor ht = Tensor::wrap(h.data(), Shape{kTotal}, DType::f32);
      std::vector<size_t> order;
      for (size_t b = 0; b < three.size(); ++b) {
        for (const dist::Reduced& r : piped.advance()) order.push_back(r.bucket);
        piped.start(b, gt);
      }
      for (const dist::Reduced& r : piped.complete()) order.push_back(r.bucket);
      CHECK(order == std::vector<size_t>{0, 1, 2});
      CHECK(piped.complete().empty());
      for (size_t b = 0; b < three.size(); ++b) alone.reduce(b, ht);
      CHECK(std::memcmp(g.data(), h.data(), g.size() * sizeof(float)) == 0);
      CHECK(piped.take_tally().sent == alone.take_tally().sent);
    }
    const auto same = [](const Tensor& a, const Tensor& b) {
      return a.numel() == b.numel() &&
             (a.numel() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
    };
    CHECK(same(piped.residual(), alone.residual()));
    CHECK(same(piped.server_residual(), alone.server_residual()));
    if (way.method == CompressMethod::powersgd) CHECK(same(piped.powersgd_q(), alone.powersgd_q()));
  }
}

// Top-k at ratio 1 sends every entry twice over: each owner's sum (from -0, rank by
// rank) keeps everything, so the compressed tensors' result is the rank-order sum bit
// for bit, and nothing is left in any residual.
TEST_CASE("two-phase top-k at ratio 1 is the exact sum in rank order") {
  dist::Communicator& comm = test_world();
  const int world = comm.size(), me = comm.rank();
  CompressOptions o;
  o.method = CompressMethod::topk;
  o.ratio = 1.0;
  o.exchange = CompressExchange::two_phase;
  Compressor c(o, comm, plan_compression(o, buckets(), kParams, 1024), kTotal, AllreduceAlgo::ring,
               5);
  std::vector<float> g = gradient(me, 3);
  Tensor gt = Tensor::wrap(g.data(), Shape{kTotal}, DType::f32);
  c.reduce(0, gt);
  c.reduce(1, gt);
  std::vector<float> want(static_cast<size_t>(kTotal), -0.0f);
  for (int r = 0; r < world; ++r) {
    const std::vector<float> x = gradient(r, 3);
    for (size_t i = 0; i < want.size(); ++i) want[i] += x[i];
  }
  // The compressed matrices (the bias travels dense, by the ring: another order).
  const size_t compressed = 3880 + 1536;
  size_t same = 0;
  for (size_t i = 0; i < compressed; ++i)
    same += std::memcmp(&want[i], &g[i], sizeof(float)) == 0 ? 1 : 0;
  CHECK(same == compressed);
  const Tensor server = c.server_residual();
  for (int64_t i = 0; i < server.numel(); ++i) CHECK(server.data<float>()[i] == 0.0f);
}

// A bucket with fewer compressed elements than ranks (a 1 x 2 matrix on 3 ranks): rank
// 0's segment is empty ([0, 0), then [0, 1) and [1, 2)), it sends and sums nothing, and every rank
// still ends with the rank-order sum (top-k at ratio 1) or the same bits (1-bit).
TEST_CASE("two-phase with an empty segment") {
  dist::Communicator& comm = test_world();
  const int world = comm.size(), me = comm.rank();
  const std::vector<ParamInfo> params = {{0, 2, 1}, {2, 2, 0}};
  const std::vector<dist::Bucket> one = {{0, 4, {1, 0}, {}}};
  for (const CompressMethod method : {CompressMethod::topk, CompressMethod::onebit}) {
    CAPTURE(to_string(method));
    CompressOptions o;
    o.method = method;
    o.ratio = 1.0;
    o.exchange = CompressExchange::two_phase;
    const std::vector<BucketPlan> plans = plan_compression(o, one, params, 1);
    REQUIRE(plans[0].compressed.size() == 1);
    Compressor c(o, comm, plans, 4, AllreduceAlgo::ring, 5);
    CHECK(c.server_residual().numel() == (2 * (me + 1) / world - 2 * me / world));
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = {0.5f * static_cast<float>(me + 1), -1.25f, 3.0f, 4.0f};
      c.reduce(0, Tensor::wrap(g.data(), Shape{4}, DType::f32));
      const std::vector<float> all = gather_all(comm, Tensor::wrap(g.data(), Shape{4}, DType::f32));
      for (int r = 1; r < world; ++r)
        CHECK(std::memcmp(all.data(), all.data() + 4 * r, 4 * sizeof(float)) == 0);
      if (method == CompressMethod::topk) {
        float want = -0.0f;
        for (int r = 0; r < world; ++r) want += 0.5f * static_cast<float>(r + 1);
        CHECK(g[0] == want);
        CHECK(g[1] == -1.25f * static_cast<float>(world));
      }
    }
  }
}

// auto: gather while gathering moves at most a quarter of the dense all-reduce's bytes,
// two_phase beyond (1-bit from 16 data ranks, top-k from 0.25 / ratio); PowerSGD takes
// neither. gather_share is what the communicator counts. Two-phase moves about twice
// what one rank sends at any size; gather grows.
TEST_CASE("compress.exchange auto, and the bytes each exchange moves") {
  CompressOptions o;
  o.method = CompressMethod::onebit;
  CHECK(resolve_exchange(o, 2) == CompressExchange::gather);
  CHECK(resolve_exchange(o, 15) == CompressExchange::gather);
  CHECK(resolve_exchange(o, 16) == CompressExchange::two_phase);
  o.method = CompressMethod::topk;
  o.ratio = 0.02;
  CHECK(resolve_exchange(o, 12) == CompressExchange::gather);
  CHECK(resolve_exchange(o, 13) == CompressExchange::two_phase);
  o.ratio = 0.01;
  CHECK(resolve_exchange(o, 25) == CompressExchange::gather);
  CHECK(resolve_exchange(o, 26) == CompressExchange::two_phase);
  // The share against the bus bytes of a bucket with no dense tensors (the 40 x 97
  // matrix alone): 1-bit's scales round up per bucket, so to within 1%.
  for (const CompressMethod method : {CompressMethod::topk, CompressMethod::onebit}) {
    o.method = method;
    o.exchange = CompressExchange::gather;
    const std::vector<BucketPlan> one = plan_compression(o, {{0, 3880, {0}, {}}}, kParams, 1024);
    for (const int world : {4, 16, 64}) {
      const double dense = 2.0 * (world - 1) / world * 3880 * 4;
      CHECK(std::fabs(bus_bytes_per_step(o, one, world) / dense / gather_share(o, world) - 1) <
            0.01);
    }
  }
  o.method = CompressMethod::onebit;
  o.exchange = CompressExchange::auto_;
  CHECK(resolve_exchange(o, 64) == CompressExchange::two_phase);
  o.exchange = CompressExchange::gather;
  CHECK(resolve_exchange(o, 64) == CompressExchange::gather);
  o.method = CompressMethod::powersgd;
  o.exchange = CompressExchange::auto_;
  CHECK(resolve_exchange(o, 64) == CompressExchange::gather);
  o.method = CompressMethod::onebit;
  const std::vector<BucketPlan> plans = plan_compression(o, buckets(), kParams, 1024);
  const double dense = 2.0 * 1023 / 1024 * kTotal * 4;
  o.exchange = CompressExchange::gather;
  CHECK(bus_bytes_per_step(o, plans, 1024) > 10 * dense);
  o.exchange = CompressExchange::two_phase;
  CHECK(bus_bytes_per_step(o, plans, 1024) < dense);
}
