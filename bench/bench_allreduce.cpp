// bench_allreduce: all-reduce time per algorithm (native MPI_Allreduce, our ring
// and hierarchical) and f32 buffer size (4 KiB x4 .. --max-bytes), run under
// mpirun, as JSON on rank 0 (stdout or --out FILE). Per size: --warmup runs, the
// median of --reps timed runs per rank, the max over ranks; algorithm and bus
// bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests reports) and the speed
// relative to native. A spot check (every element equals the sum of rank + 1)
// runs after timing. Not a test. Usage: mpirun -n N bench_allreduce
// [--max-bytes 268435456] [--reps 5] [--warmup 2] [--ranks-per-node R] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace {

using namespace dtrain;
using namespace dtrain::dist;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t max_bytes = int64_t{256} << 20;
  int reps = 5, warmup = 2;
  std::optional<int> ranks_per_node;
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
    else if (k == "--reps")
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
  return a;
}

// Max over ranks of this rank's median time of `reps` all-reduces of `buf`.
double time_allreduce(Communicator& comm, Tensor buf, AllreduceAlgo algo, const Args& a) {
  for (int i = 0; i < a.warmup; ++i) comm.all_reduce(buf, ReduceOp::sum, algo);
  std::vector<double> t;
  for (int i = 0; i < a.reps; ++i) {
    comm.barrier();
    const auto t0 = Clock::now();
    comm.all_reduce(buf, ReduceOp::sum, algo);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  double median = t[t.size() / 2];
  Tensor m = Tensor::wrap(&median, {1}, DType::f64);
  comm.all_reduce(m, ReduceOp::max, AllreduceAlgo::native);
  return median;
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

std::vector<AllreduceAlgo> algorithms(Communicator& comm) {
  std::vector<AllreduceAlgo> algos{AllreduceAlgo::native, AllreduceAlgo::ring};
  const Topology topo = comm.topology();
  if (topo.ranks_per_node > 0) algos.push_back(AllreduceAlgo::hierarchical);
  return algos;
}

nlohmann::json run(Communicator& comm, const Args& a, bool& ok) {
  const int64_t max_elems = a.max_bytes / 4;
  Tensor whole = Tensor::empty({max_elems}, DType::f32);
  std::fill_n(whole.data<float>(), max_elems, 1.0f);
  const std::vector<AllreduceAlgo> algos = algorithms(comm);
  const double bus_factor = 2.0 * (comm.size() - 1) / comm.size();
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes = 4096; bytes <= a.max_bytes; bytes *= 4) {
    Tensor buf = whole.view(0, {bytes / 4});
    double native = 0.0;
    for (AllreduceAlgo algo : algos) {
      const double s = time_allreduce(comm, buf, algo, a);
      if (algo == AllreduceAlgo::native) native = s;
      const bool good = spot_check(comm, buf, algo);
      ok = ok && good;
      const double algbw = bytes / s / 1e9;
      rows.push_back({{"bytes", bytes},
                      {"algorithm", std::string(to_string(algo))},
                      {"time_us", s * 1e6},
                      {"algbw_gbs", algbw},
                      {"busbw_gbs", algbw * bus_factor},
                      {"speed_vs_native", native / s},
                      {"check_ok", good}});
    }
  }
  const Topology topo = comm.topology();
  return {{"ranks", comm.size()},
          {"nodes", topo.nodes},
          {"ranks_per_node", topo.ranks_per_node},
          {"dtype", "f32"},
          {"reps", a.reps},
          {"warmup", a.warmup},
          {"time", "median per rank, max over ranks"},
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
