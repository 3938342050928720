// The MPI communicator and the all-reduce algorithms on 2-4 ranks (run under
// mpirun by ctest). Each all-reduce is checked three ways: against an fp64 / exact
// reference computed from every rank's (regenerated) input, for identical bytes
// on every rank (CRC-32C gathered and compared), and for identical bytes when the
// same all-reduce runs again.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
#include "dist/allreduce.h"
#include "dist/grid.h"
#include "mpi_world.h"

using namespace dtrain;
using namespace dtrain::dist;

namespace {

// Rank r's input element i: signed, varied, exactly representable in every dtype.
double input_value(int rank, size_t i) {
  const long v = static_cast<long>((i * 7919 + static_cast<size_t>(rank) * 104729) % 2001) - 1000;
  return static_cast<double>(v) / 64.0 + rank;  // a multiple of 1/64: exact in f32
}

template <typename T>
T input(int rank, size_t i) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(input_value(rank, i) * 64.0) * (sizeof(T) == 8 ? (T{1} << 33) : T{1});
  } else {
    return static_cast<T>(input_value(rank, i));
  }
}

// Every rank holds the same bytes: gather each rank's CRC-32C and compare.
bool same_on_every_rank(Communicator& comm, const Tensor& t) {
  std::vector<int64_t> mine{crc32c(t.raw(), t.nbytes())}, all(comm.size());
  Tensor in = Tensor::wrap(mine.data(), {1}, DType::i64);
  Tensor out = Tensor::wrap(all.data(), {comm.size()}, DType::i64);
  comm.all_gather(in, out);
  return std::all_of(all.begin(), all.end(), [&](int64_t c) { return c == all[0]; });
}

template <typename T>
Tensor make_input(Communicator& comm, size_t n) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, dtype_of<T>());
  for (size_t i = 0; i < n; ++i) t.data<T>()[i] = input<T>(comm.rank(), i);
  return t;
}

template <typename T>
void check_against_reference(Communicator& comm, const Tensor& t, ReduceOp op) {
  const T* got = t.data<T>();
  const size_t n = static_cast<size_t>(t.numel());
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double ref = op == ReduceOp::sum ? 0.0 : -std::numeric_limits<double>::infinity();
    double mag = 0.0;
    for (int r = 0; r < comm.size(); ++r) {
      const double x = static_cast<double>(input<T>(r, i));
      ref = op == ReduceOp::sum ? ref + x : std::max(ref, x);
      mag += std::abs(x);
    }
    const double tol = std::is_integral_v<T> ? 0.0 : 4 * std::numeric_limits<T>::epsilon() * mag;
    if (std::abs(static_cast<double>(got[i]) - ref) > tol) ++bad;
  }
  CHECK(bad == 0);
}

template <typename T>
void check_allreduce(Communicator& comm, AllreduceAlgo algo, size_t n, ReduceOp op) {
  CAPTURE(to_string(algo));
  CAPTURE(n);
  CAPTURE(dtype_name(dtype_of<T>()));
  CAPTURE(op == ReduceOp::sum ? "sum" : "max");
  Tensor a = make_input<T>(comm, n), b = make_input<T>(comm, n);
  comm.all_reduce(a, op, algo);
  comm.all_reduce(b, op, algo);
  check_against_reference<T>(comm, a, op);
  CHECK(same_on_every_rank(comm, a));
  CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

void check_algorithm(Communicator& comm, AllreduceAlgo algo) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 20) + 3}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      check_allreduce<float>(comm, algo, n, op);
      check_allreduce<double>(comm, algo, n, op);
      check_allreduce<int64_t>(comm, algo, n, op);
    }
  }
  check_allreduce<int32_t>(comm, algo, 1000, ReduceOp::sum);
}

}  // namespace

TEST_CASE("the world") {
  Communicator& w = test_world();
  CHECK(w.backend() == "mpi");
  CHECK(w.size() >= 2);
  CHECK(w.rank() < w.size());
}

TEST_CASE("all_reduce native") { check_algorithm(test_world(), AllreduceAlgo::native); }

TEST_CASE("all_reduce ring") { check_algorithm(test_world(), AllreduceAlgo::ring); }

TEST_CASE("all_reduce hierarchical, nodes from the shared-memory split (one node)") {
  Communicator& w = test_world();
  CHECK(w.topology().nodes == 1);
  CHECK(w.topology().ranks_per_node == w.size());
  check_algorithm(w, AllreduceAlgo::hierarchical);
}

TEST_CASE("all_reduce hierarchical, emulated nodes") {
  Communicator& w = test_world();
  for (int rpn : {1, 2}) {
    if (w.size() % rpn != 0) continue;
    CAPTURE(rpn);
    auto comm = make_world_communicator({rpn});
    const Topology topo = comm->topology();
    CHECK(topo.nodes == w.size() / rpn);
    CHECK(topo.ranks_per_node == rpn);
    check_algorithm(*comm, AllreduceAlgo::hierarchical);
  }
}

TEST_CASE("hierarchical refuses nodes of different sizes, naming comm.ranks_per_node") {
  Communicator& w = test_world();
  if (w.size() == 2) return;
  auto comm = make_world_communicator({w.size() == 3 ? 2 : 3});
  CHECK(comm->topology().ranks_per_node == 0);
  std::vector<float> v(10, 1.0f);
  Tensor t = Tensor::wrap(v.data(), {10}, DType::f32);
  CHECK_THROWS_WITH_AS(comm->all_reduce(t, ReduceOp::sum, AllreduceAlgo::hierarchical),
                       doctest::Contains("comm.ranks_per_node"), Error);
  comm->all_reduce(t, ReduceOp::sum, AllreduceAlgo::ring);  // still usable
  CHECK(v[9] == static_cast<float>(w.size()));
}

TEST_CASE("async all-reduces overlap and complete in issue order, waited in reverse") {
  Communicator& w = test_world();
  const AllreduceAlgo algos[] = {AllreduceAlgo::ring, AllreduceAlgo::native,
                                 AllreduceAlgo::hierarchical, AllreduceAlgo::ring};
  std::vector<std::vector<double>> bufs(4, std::vector<double>(50000));
  std::vector<Handle> handles;
  for (size_t k = 0; k < 4; ++k) {
    for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = input_value(w.rank(), i + k);
    Tensor t = Tensor::wrap(bufs[k].data(), {50000}, DType::f64);
    handles.push_back(w.all_reduce_async(t, ReduceOp::sum, algos[k]));
  }
  for (size_t k = 4; k-- > 0;) handles[k].wait();
  for (Handle& h : handles) CHECK(h.test());
  for (size_t k = 0; k < 4; ++k) {
    double ref = 0.0;
    for (int r = 0; r < w.size(); ++r) ref += input_value(r, 777 + k);
    CHECK(bufs[k][777] == doctest::Approx(ref).epsilon(1e-12));
  }
}

TEST_CASE("reduce_scatter, all_gather, broadcast, send/recv, barrier") {
  Communicator& w = test_world();
  const int p = w.size(), me = w.rank();
  const int n = 5;
  std::vector<float> in(p * n), out(n);
  for (int i = 0; i < p * n; ++i) in[i] = static_cast<float>(me * 100 + i);
  Tensor ti = Tensor::wrap(in.data(), {p * n}, DType::f32),
         to = Tensor::wrap(out.data(), {n}, DType::f32);
  w.reduce_scatter(ti, to);
  for (int i = 0; i < n; ++i) {
    float ref = 0;
    for (int r = 0; r < p; ++r) ref += static_cast<float>(r * 100 + me * n + i);
    CHECK(out[i] == ref);
  }

  std::vector<int64_t> mine(3, me), all(3 * p);
  Tensor tm = Tensor::wrap(mine.data(), {3}, DType::i64),
         ta = Tensor::wrap(all.data(), {3 * p}, DType::i64);
  w.all_gather(tm, ta);
  for (int i = 0; i < 3 * p; ++i) CHECK(all[i] == i / 3);

  std::vector<double> b(4, me);
  Tensor tb = Tensor::wrap(b.data(), {4}, DType::f64);
  w.broadcast(tb, p - 1);
  CHECK(b == std::vector<double>(4, p - 1));

  std::vector<int32_t> token(2, me), got(2, -1);
  Tensor tt = Tensor::wrap(token.data(), {2}, DType::i32),
         tg = Tensor::wrap(got.data(), {2}, DType::i32);
  if (me % 2 == 0) {  // a ring pass without deadlock: evens send first
    w.send(tt, (me + 1) % p);
    w.recv(tg, (me + p - 1) % p);
  } else {
    w.recv(tg, (me + p - 1) % p);
    w.send(tt, (me + 1) % p);
  }
  CHECK(got[0] == (me + p - 1) % p);
  w.barrier();
}

// Block r of every rank's input lands at block `rank` of rank r's output: rank me's
// output block r holds what rank r put in its block me. Asynchronous, i32 and f32.
TEST_CASE("all_to_all: every rank's block for each peer, asynchronous") {
  Communicator& w = test_world();
  const int p = w.size(), me = w.rank(), n = 3;
  std::vector<int32_t> in(static_cast<size_t>(p * n)), out(in.size(), -1);
  for (int i = 0; i < p * n; ++i) in[static_cast<size_t>(i)] = me * 1000 + i;
  std::vector<float> fin(in.begin(), in.end()), fout(in.size(), -1.0f);
  Handle a = w.all_to_all_async(Tensor::wrap(in.data(), {p * n}, DType::i32),
                                Tensor::wrap(out.data(), {p * n}, DType::i32));
  Handle b = w.all_to_all_async(Tensor::wrap(fin.data(), {p * n}, DType::f32),
                                Tensor::wrap(fout.data(), {p * n}, DType::f32));
  a.wait();
  b.wait();
  for (int r = 0; r < p; ++r) {
    for (int j = 0; j < n; ++j) {
      const size_t at = static_cast<size_t>(r * n + j);
      CHECK(out[at] == r * 1000 + me * n + j);
      CHECK(fout[at] == static_cast<float>(r * 1000 + me * n + j));
    }
  }
  // The same buffer for both sides is a caller's bug (MPI forbids it).
  CHECK_THROWS_AS(w.all_to_all_async(Tensor::wrap(in.data(), {p * n}, DType::i32),
                                     Tensor::wrap(in.data(), {p * n}, DType::i32)),
                  InternalError);
}

// ZeRO-3's gather: unequal blocks (one rank's empty), in place, any dtype (bf16 moves
// as 16-bit integers), two in flight at once completing in issue order.
TEST_CASE("all_gatherv: unequal blocks in place, bf16 too, asynchronous") {
  Communicator& w = test_world();
  const int p = w.size(), me = w.rank();
  std::vector<int64_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(r == 1 ? 0 : 2 * r + 3);
  int64_t total = 0, at = 0;
  for (int r = 0; r < p; ++r) {
    if (r < me) at += counts[static_cast<size_t>(r)];
    total += counts[static_cast<size_t>(r)];
  }
  std::vector<float> f(static_cast<size_t>(total), -1.0f);
  std::vector<uint16_t> h(static_cast<size_t>(total), 0xffff);
  for (int64_t i = 0; i < counts[static_cast<size_t>(me)]; ++i) {
    f[static_cast<size_t>(at + i)] = static_cast<float>(me * 1000 + i);
    h[static_cast<size_t>(at + i)] = static_cast<uint16_t>(me * 100 + i);
  }
  Tensor tf = Tensor::wrap(f.data(), {total}, DType::f32);
  Tensor th = Tensor::wrap(h.data(), {total}, DType::bf16);
  Handle a = w.all_gatherv_async(tf, counts);
  Handle b = w.all_gatherv_async(th, counts);
  b.wait();
  CHECK(a.test());  // issued first, so finished first
  a.wait();
  int64_t k = 0;
  for (int r = 0; r < p; ++r) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i, ++k) {
      CHECK(f[static_cast<size_t>(k)] == static_cast<float>(r * 1000 + i));
      CHECK(h[static_cast<size_t>(k)] == static_cast<uint16_t>(r * 100 + i));
    }
  }
  std::vector<int64_t> wrong(static_cast<size_t>(p), 1);
  CHECK_THROWS(w.all_gatherv_async(tf, wrong));  // counts that do not sum to the buffer
}

TEST_CASE("split: colour groups ordered by key") {
  Communicator& w = test_world();
  auto child = w.split(w.rank() % 2, -w.rank());
  const int members = (w.size() + 1 - w.rank() % 2) / 2;
  CHECK(child->size() == members);
  CHECK(child->rank() == members - 1 - w.rank() / 2);  // descending world rank
  std::vector<int64_t> v{w.rank()};
  Tensor t = Tensor::wrap(v.data(), {1}, DType::i64);
  child->all_reduce(t, ReduceOp::sum, AllreduceAlgo::ring);
  int64_t ref = 0;
  for (int r = w.rank() % 2; r < w.size(); r += 2) ref += r;
  CHECK(v[0] == ref);
}

TEST_CASE("stats count calls, bytes and time, last_op names the algorithm") {
  Communicator& w = test_world();
  auto comm = w.split(0, w.rank());
  CHECK(comm->last_op().seq == 0);
  std::vector<float> v(1000, 1.0f);
  Tensor t = Tensor::wrap(v.data(), {1000}, DType::f32);
  comm->all_reduce(t, ReduceOp::sum, AllreduceAlgo::ring);
  comm->all_reduce_async(t, ReduceOp::max, AllreduceAlgo::native).wait();
  comm->broadcast(t, 0);
  const CommStats s = comm->stats();
  CHECK(s.calls == 3);
  CHECK(s.completed == 3);
  CHECK(s.bytes == 3 * 4000);
  CHECK(s.seconds > 0.0);
  CHECK(comm->last_op().seq == 3);
  CHECK(comm->last_op().op == "broadcast");
  comm->all_reduce(t, ReduceOp::sum, AllreduceAlgo::ring);
  CHECK(comm->last_op().op == "all_reduce(ring)");
  CHECK(comm->last_op().bytes == 4000);
}

TEST_CASE("auto tuning: every rank reaches the same table") {
  Communicator& w = test_world();
  auto comm = make_world_communicator({w.size() % 2 == 0 ? 2 : 1});
  const AutoChoice choice = tune_allreduce(*comm, {4096, 64 << 10, 1 << 20}, 2);
  REQUIRE(choice.entries.size() == 3);
  const size_t candidates = w.size() == 4 ? 3 : 2;  // hierarchical: 2 nodes of 2 ranks
  std::vector<double> mine;
  for (const AutoEntry& e : choice.entries) {
    CHECK(e.seconds.size() == candidates);
    mine.push_back(static_cast<double>(e.algo));
    for (const auto& [algo, s] : e.seconds) mine.push_back(s);
  }
  Tensor t = Tensor::wrap(mine.data(), {static_cast<int64_t>(mine.size())}, DType::f64);
  CHECK(same_on_every_rank(w, t));
  if (w.rank() == 0) MESSAGE(format_auto_choice(choice));
}

// A grid's data groups take the table their first group timed: the root's sizes and
// algorithms on every rank, whatever each held before (an empty table included), in
// order; the times stay the root's.
TEST_CASE("broadcast_choice: the root's table on every rank") {
  Communicator& w = test_world();
  const int root = w.size() - 1;
  AutoChoice mine;
  if (w.rank() == root) {
    mine.entries = {{4096, AllreduceAlgo::ring, {{AllreduceAlgo::ring, 1e-3}}},
                    {1 << 20, AllreduceAlgo::hierarchical, {}},
                    {size_t{3} << 30, AllreduceAlgo::native, {}}};
  } else if (w.rank() % 2 == 0) {  // a table of its own, which the root's replaces
    mine.entries = {{64, AllreduceAlgo::native, {}}};
  }
  const AutoChoice got = broadcast_choice(w, mine, root);
  REQUIRE(got.entries.size() == 3);
  CHECK(got.entries[0].bytes == 4096);
  CHECK(got.entries[0].algo == AllreduceAlgo::ring);
  CHECK(got.entries[1].bytes == size_t{1} << 20);
  CHECK(got.entries[1].algo == AllreduceAlgo::hierarchical);
  CHECK(got.entries[2].bytes == size_t{3} << 30);  // past 32 bits
  CHECK(got.entries[2].algo == AllreduceAlgo::native);
  CHECK(got.algo_for(5000) == AllreduceAlgo::hierarchical);  // the class above
  CHECK(got.entries[0].seconds.size() == (w.rank() == root ? 1u : 0u));
  // Nothing timed: an empty table everywhere.
  CHECK(broadcast_choice(w, w.rank() == root ? AutoChoice{} : mine, root).entries.empty());
}

TEST_CASE("process grid groups over MPI") {
  Communicator& w = test_world();
  const GridDegrees d = w.size() == 4 ? GridDegrees{1, 2, 2} : GridDegrees{1, w.size(), 1};
  ProcessGrid grid(w, d);
  CHECK(grid.group(Axis::pipeline).size() == 1);
  CHECK(grid.group(Axis::data).size() == d.data);
  CHECK(grid.group(Axis::tensor).size() == d.tensor);
  CHECK(grid.group(Axis::data).rank() == grid.coord().dp);
  CHECK(grid.group(Axis::tensor).rank() == grid.coord().tp);
  std::vector<int64_t> v{w.rank()};
  Tensor t = Tensor::wrap(v.data(), {1}, DType::i64);
  grid.group(Axis::data).all_reduce(t);
  int64_t ref = 0;
  for (int dp = 0; dp < d.data; ++dp) ref += grid_rank({grid.coord().pp, dp, grid.coord().tp}, d);
  CHECK(v[0] == ref);
  grid.group(Axis::pipeline).all_reduce(t);  // size 1: a no-op
  CHECK(v[0] == ref);
}
