// bench_allreduce: all-reduce time per algorithm (native MPI_Allreduce, our ring
// and hierarchical) and f32 buffer size (--min-bytes x4 .. --max-bytes, or the one
// size --bytes), run under mpirun, as JSON on rank 0 (stdout or --out FILE). Per
// size: --warmup runs, then --reps timed runs, each after a barrier; time_us is the
// median per rank, max over ranks; rep_times_us the max over ranks of each run and
// best_time_us the least of those (best-of, for noisy machines); algorithm and bus
// bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests reports, from time_us) and the
// speed relative to native. A spot check (every element equals the sum of rank + 1)
// runs after timing. Not a test. Usage: mpirun -n N bench_allreduce
// [--max-bytes 268435456] [--min-bytes 4096] [--bytes N] [--reps 5] [--warmup 2]
// [--algorithms native,ring,hierarchical] [--ranks-per-node R] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace {

using namespace dtrain;
using namespace dtrain::dist;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t max_bytes = int64_t{256} << 20, min_bytes = 4096;
  std::optional<int64_t> bytes;  // one size only
  int reps = 5, warmup = 2;
  std::optional<int> ranks_per_node;
  std::vector<std::string> algorithms;  // empty: every one that applies
  std::string out;
};

int64_t positive(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x <= 0) {
    throw Error(flag + " expects a positive integer, got \"" + v + "\"", "e.g. " + flag + " 4");
  }
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw Error(k + " needs a value", "see the usage line");
    const std::string v = argv[i + 1];
    if (k == "--max-bytes")
      a.max_bytes = positive(k, v);
    else if (k == "--min-bytes")
      a.min_bytes = positive(k, v);
    else if (k == "--bytes")
      a.bytes = positive(k, v);
    else if (k == "--algorithms") {
      std::stringstream ss(v);
      for (std::string name; std::getline(ss, name, ',');) {
        if (name != "native" && name != "ring" && name != "hierarchical") {
          throw Error("--algorithms: unknown algorithm \"" + name + "\"",
                      "use a comma-separated list of native, ring, hierarchical");
        }
        a.algorithms.push_back(name);
      }
    } else if (k == "--reps")
      a.reps = static_cast<int>(positive(k, v));
    else if (k == "--warmup")
      a.warmup = static_cast<int>(std::max<int64_t>(0, std::atoll(v.c_str())));
    else if (k == "--ranks-per-node")
      a.ranks_per_node = static_cast<int>(positive(k, v));
    else if (k == "--out")
      a.out = v;
    else
      throw Error("unknown option " + k, "see the usage line in bench_allreduce.cpp");
  }
  if (a.bytes && *a.bytes < 4)
    throw Error("--bytes must be at least 4 (one float)", "e.g. --bytes 102000000");
  if (!a.bytes && a.min_bytes > a.max_bytes) {
    throw Error("--min-bytes is above --max-bytes", "e.g. --min-bytes 4096 --max-bytes 268435456");
  }
  return a;
}

struct Timing {
  double median = 0.0;          // max over ranks of each rank's median
  std::vector<double> per_rep;  // max over ranks of each timed run
  double best() const { return *std::min_element(per_rep.begin(), per_rep.end()); }
};

// `reps` timed all-reduces of `buf`, each after a barrier.
Timing time_allreduce(Communicator& comm, Tensor buf, AllreduceAlgo algo, const Args& a) {
  for (int i = 0; i < a.warmup; ++i) comm.all_reduce(buf, ReduceOp::sum, algo);
  std::vector<double> t;
  for (int i = 0; i < a.reps; ++i) {
    comm.barrier();
    const auto t0 = Clock::now();
    comm.all_reduce(buf, ReduceOp::sum, algo);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  Timing out;
  out.per_rep = t;
  Tensor r = Tensor::wrap(out.per_rep.data(), {static_cast<int64_t>(t.size())}, DType::f64);
  comm.all_reduce(r, ReduceOp::max, AllreduceAlgo::native);
  std::sort(t.begin(), t.end());
  out.median = t[t.size() / 2];
  Tensor m = Tensor::wrap(&out.median, {1}, DType::f64);
  comm.all_reduce(m, ReduceOp::max, AllreduceAlgo::native);
  return out;
}

// Every element must be 1 + 2 + ... + size after one all-reduce of rank + 1.
bool spot_check(Communicator& comm, Tensor buf, AllreduceAlgo algo) {
  float* p = buf.data<float>();
  std::fill_n(p, buf.numel(), static_cast<float>(comm.rank() + 1));
  comm.all_reduce(buf, ReduceOp::sum, algo);
  const float want = comm.size() * (comm.size() + 1) / 2.0f;
  int64_t bad = std::count_if(p, p + buf.numel(), [&](float x) { return x != want; });
  Tensor b = Tensor::wrap(&bad, {1}, DType::i64);
  comm.all_reduce(b, ReduceOp::sum, AllreduceAlgo::native);
  return bad == 0;
}

std::vector<AllreduceAlgo> algorithms(Communicator& comm, const Args& a) {
  const Topology topo = comm.topology();
  if (a.algorithms.empty()) {
    std::vector<AllreduceAlgo> algos{AllreduceAlgo::native, AllreduceAlgo::ring};
    if (topo.ranks_per_node > 0) algos.push_back(AllreduceAlgo::hierarchical);
    return algos;
  }
  std::vector<AllreduceAlgo> algos;
  for (const std::string& name : a.algorithms) {
    if (name == "native") algos.push_back(AllreduceAlgo::native);
    if (name == "ring") algos.push_back(AllreduceAlgo::ring);
    if (name == "hierarchical") {
      if (topo.ranks_per_node == 0) {
        throw Error("--algorithms hierarchical: the nodes hold different numbers of ranks",
                    "pass --ranks-per-node R with R dividing the number of ranks");
      }
      algos.push_back(AllreduceAlgo::hierarchical);
    }
  }
  return algos;
}

std::vector<int64_t> sizes(const Args& a) {
  if (a.bytes) return {*a.bytes / 4 * 4};
  std::vector<int64_t> out;
  for (int64_t bytes = a.min_bytes / 4 * 4; bytes <= a.max_bytes; bytes *= 4) {
    out.push_back(std::max<int64_t>(bytes, 4));
  }
  return out;
}

nlohmann::json run(Communicator& comm, const Args& a, bool& ok) {
  const std::vector<int64_t> byte_sizes = sizes(a);
  const int64_t max_elems = *std::max_element(byte_sizes.begin(), byte_sizes.end()) / 4;
  Tensor whole = Tensor::empty({max_elems}, DType::f32);
  std::fill_n(whole.data<float>(), max_elems, 1.0f);
  const std::vector<AllreduceAlgo> algos = algorithms(comm, a);
  const double bus_factor = 2.0 * (comm.size() - 1) / comm.size();
  nlohmann::json rows = nlohmann::json::array();
  for (const int64_t bytes : byte_sizes) {
    Tensor buf = whole.view(0, {bytes / 4});
    double native = 0.0;
    for (AllreduceAlgo algo : algos) {
      const Timing t = time_allreduce(comm, buf, algo, a);
      const double s = t.median;
      if (algo == AllreduceAlgo::native) native = s;
      const bool good = spot_check(comm, buf, algo);
      ok = ok && good;
      const double algbw = bytes / s / 1e9;
      nlohmann::json reps = nlohmann::json::array();
      for (double r : t.per_rep) reps.push_back(r * 1e6);
      nlohmann::json row = {{"bytes", bytes},
                            {"algorithm", std::string(to_string(algo))},
                            {"time_us", s * 1e6},
                            {"best_time_us", t.best() * 1e6},
                            {"rep_times_us", reps},
                            {"algbw_gbs", algbw},
                            {"busbw_gbs", algbw * bus_factor},
                            {"check_ok", good}};
      if (native > 0.0) row["speed_vs_native"] = native / s;
      rows.push_back(row);
    }
  }
  const Topology topo = comm.topology();
  return {{"ranks", comm.size()},
          {"nodes", topo.nodes},
          {"ranks_per_node", topo.ranks_per_node},
          {"dtype", "f32"},
          {"reps", a.reps},
          {"warmup", a.warmup},
          {"time",
           "time_us: median per rank, max over ranks; best_time_us: least over runs "
           "of the max over ranks"},
          {"results", rows}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    auto comm = make_world_communicator(WorldOptions{a.ranks_per_node});
    bool ok = true;
    const nlohmann::json out = run(*comm, a, ok);
    if (comm->rank() == 0) {
      if (a.out.empty()) {
        std::printf("%s\n", out.dump(2).c_str());
      } else {
        std::ofstream(a.out) << out.dump(2) << "\n";
      }
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 2;
  }
}
