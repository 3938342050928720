// The comm suite of `dtrain bench` (bench.h). Timing runs on zeros (a sum of zeros
// stays zero, so repeated runs cannot overflow); the check afterwards fills each
// rank's buffer with rank + 1 and compares every element with the exact sum, which
// small integers keep in bf16 as well.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "dist/communicator.h"
#include "kernels/memory.h"
#include "runtime/bench.h"

namespace dtrain::runtime {

namespace {

using Clock = std::chrono::steady_clock;

enum class CommOp { all_reduce, reduce_scatter, all_gather, all_to_all };

const char* op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce:
      return "all_reduce";
    case CommOp::reduce_scatter:
      return "reduce_scatter";
    case CommOp::all_gather:
      return "all_gather";
    case CommOp::all_to_all:
      return "all_to_all";
  }
  return "?";
}

std::string human_bytes(int64_t b) {
  if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0) return fmt::format("{}MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}KiB", b >> 10);
  return fmt::format("{}B", b);
}

void fill(Tensor& t, float value) {
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  for (int64_t i = 0; i < h.numel(); ++i) {
    if (t.dtype() == DType::bf16) {
      h.data<bf16>()[i] = to_bf16(value);
    } else {
      h.data<float>()[i] = value;
    }
  }
  kernels::copy(h, t);
}

float element(const Tensor& host, int64_t i) {
  return host.dtype() == DType::bf16 ? to_f32(host.data<bf16>()[i]) : host.data<float>()[i];
}

// The slowest rank's value, on every rank.
double slowest(dist::Communicator& host, double seconds) {
  Tensor t = Tensor::wrap(&seconds, {1}, DType::f64);
  host.all_reduce(t, dist::ReduceOp::max);
  return seconds;
}

// One collective on buffers sized for `bytes` (the whole buffer: all-reduce's, the
// reduce-scatter's input, the all-gather's output, the all-to-all's input and output).
struct Collective {
  CommOp op;
  AllreduceAlgo algo;
  Tensor big, small;  // all_reduce: big only; all_to_all: big in, small out (as big)

  void run(dist::Communicator& comm) {
    switch (op) {
      case CommOp::all_reduce:
        comm.all_reduce(big, dist::ReduceOp::sum, algo);
        break;
      case CommOp::reduce_scatter:
        comm.reduce_scatter(big, small);
        break;
      case CommOp::all_gather:
        comm.all_gather(small, big);
        break;
      case CommOp::all_to_all:
        comm.all_to_all_async(big, small).wait();
        break;
    }
  }

  // Elements that differ from the exact result after one run on rank + 1 everywhere,
  // summed over the ranks.
  int64_t wrong(dist::Communicator& host, dist::Communicator& comm) {
    const int n = comm.size();
    const float mine = static_cast<float>(comm.rank() + 1);
    const float sum = static_cast<float>(n * (n + 1) / 2);
    if (op == CommOp::all_to_all) {  // rank s's block d holds s n + d + 1
      Tensor h = Tensor::empty(big.shape(), big.dtype());
      const int64_t block = big.numel() / n;
      for (int64_t i = 0; i < h.numel(); ++i) {
        const auto v = static_cast<float>(comm.rank() * n + i / block + 1);
        if (h.dtype() == DType::bf16) {
          h.data<bf16>()[i] = to_bf16(v);
        } else {
          h.data<float>()[i] = v;
        }
      }
      kernels::copy(h, big);
    } else {
      fill(op == CommOp::all_gather ? small : big, mine);
    }
    run(comm);
    kernels::synchronize(comm.device());
    int64_t bad = 0;
    if (op == CommOp::all_to_all) {  // block r from rank r, its block rank()
      const Tensor h = kernels::to_host(small);
      const int64_t block = small.numel() / n;
      for (int64_t i = 0; i < h.numel(); ++i) {
        float want = static_cast<float>((i / block) * n + comm.rank() + 1);
        if (h.dtype() == DType::bf16) want = to_f32(to_bf16(want));  // as the sender rounded it
        bad += element(h, i) != want ? 1 : 0;
      }
    } else if (op == CommOp::all_gather) {  // block r from rank r
      const Tensor h = kernels::to_host(big);
      const int64_t block = small.numel();
      for (int64_t i = 0; i < h.numel(); ++i)
        bad += element(h, i) != static_cast<float>(i / block + 1) ? 1 : 0;
    } else {
      const Tensor h = kernels::to_host(op == CommOp::all_reduce ? big : small);
      for (int64_t i = 0; i < h.numel(); ++i) bad += element(h, i) != sum ? 1 : 0;
    }
    Tensor t = Tensor::wrap(&bad, {1}, DType::i64);
    host.all_reduce(t, dist::ReduceOp::sum);
    return bad;
  }
};

std::vector<AllreduceAlgo> algorithms(const dist::Topology& topo, const CommBenchOptions& c) {
  if (c.algorithms.empty()) {
    std::vector<AllreduceAlgo> out{AllreduceAlgo::native, AllreduceAlgo::ring};
    if (topo.nodes > 1 && topo.ranks_per_node > 1) out.push_back(AllreduceAlgo::hierarchical);
    return out;
  }
  for (AllreduceAlgo a : c.algorithms) {
    if (a == AllreduceAlgo::auto_) {
      throw Error("--algorithms auto: auto is a choice among the others, timed per run",
                  "use --algorithms native,ring,hierarchical");
    }
    if (a == AllreduceAlgo::hierarchical && topo.ranks_per_node == 0) {
      throw Error("--algorithms hierarchical: the nodes hold different numbers of ranks",
                  "pass --ranks-per-node R with R dividing the number of ranks");
    }
  }
  return c.algorithms;
}

}  // namespace

nlohmann::json bench_comm(dist::Communicator& host, dist::Communicator& comm, const BenchOptions& o,
                          const CommBenchOptions& c,
                          const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& line) {
    if (host.rank() == 0) progress(line);
  };
  const int n = comm.size();
  const dist::Topology topo = comm.topology();
  const std::vector<AllreduceAlgo> algos = algorithms(topo, c);
  DTRAIN_CHECK(c.min_bytes >= 4 && c.min_bytes <= c.max_bytes, "comm sizes {} .. {}", c.min_bytes,
               c.max_bytes);  // the command line's check came first
  const Device device = comm.device();
  nlohmann::json out = nlohmann::json::array();
  for (DType dt : o.dtypes) {
    const char* dname = dt == DType::bf16 ? "bf16" : "fp32";
    if (dt == DType::bf16 && !device.is_cuda()) {
      say("comm bf16: skipped (MPI sums f32 and f64 on the host; NCCL sums bf16 on GPUs)");
      continue;
    }
    const int64_t esize = dt == DType::bf16 ? 2 : 4;
    for (int64_t want = c.min_bytes; want <= c.max_bytes; want *= 4) {
      // Whole elements, and for the two halves of an all-reduce one block per rank.
      const int64_t block = std::max<int64_t>(1, want / esize / n);
      const int64_t elems_ar = std::max<int64_t>(1, want / esize);
      double native = 0;
      std::vector<Collective> figures;
      for (AllreduceAlgo a : algos) figures.push_back({CommOp::all_reduce, a, {}, {}});
      figures.push_back({CommOp::reduce_scatter, AllreduceAlgo::native, {}, {}});
      figures.push_back({CommOp::all_gather, AllreduceAlgo::native, {}, {}});
      figures.push_back({CommOp::all_to_all, AllreduceAlgo::native, {}, {}});
      for (Collective& f : figures) {
        const bool ar = f.op == CommOp::all_reduce;
        const int64_t elems = ar ? elems_ar : block * n;
        const int64_t bytes = elems * esize;
        const std::string name =
            fmt::format("{}/{}/{} x{}", op_name(f.op), to_string(f.algo), human_bytes(want), n);
        if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
        Allocator* alloc = &kernels::device_allocator(device);
        f.big = Tensor::empty({elems}, dt, alloc);
        if (!ar) f.small = Tensor::empty({f.op == CommOp::all_to_all ? elems : block}, dt, alloc);
        fill(f.big, 0.0f);
        if (!ar) fill(f.small, 0.0f);
        f.run(comm);  // warm-up: connections, pages, the ring's scratch
        kernels::synchronize(device);
        const Timing t = time_samples(
            [&] {
              host.barrier();
              const Clock::time_point t0 = Clock::now();
              f.run(comm);
              kernels::synchronize(device);
              return slowest(host, std::chrono::duration<double>(Clock::now() - t0).count());
            },
            o);
        const int64_t bad = f.wrong(host, comm);
        const double factor = ar ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        const double algbw = static_cast<double>(bytes) / t.median / 1e9;
        nlohmann::json r = {{"suite", "comm"},
                            {"name", name},
                            {"dtype", dname},
                            {"device", device.str()},
                            {"shape", fmt::format("{} bytes, {} ranks", bytes, n)},
                            {"op", op_name(f.op)},
                            {"algorithm", std::string(to_string(f.algo))},
                            {"bytes", bytes},
                            {"ranks", n},
                            {"nodes", topo.nodes},
                            {"ranks_per_node", topo.ranks_per_node},
                            {"runs", t.runs},
                            {"seconds_median", t.median},
                            {"seconds_p10", t.p10},
                            {"seconds_p90", t.p90},
                            {"spread", t.spread()},
                            {"seconds_runs", t.samples},
                            {"algbw_gbytes_per_s", algbw},
                            {"busbw_gbytes_per_s", algbw * factor},
                            {"check", {{"ok", bad == 0}, {"wrong_elements", bad}}}};
        if (ar && f.algo == AllreduceAlgo::native) native = t.median;
        if (ar && native > 0) r["speed_vs_native"] = native / t.median;
        say(fmt::format("{:<38} {:<4} {:>9.3f} ms +-{:4.1f}%  busbw {:7.2f} GB/s  check {}", name,
                        dname, t.median * 1e3, 100.0 * t.spread() / 2, algbw * factor,
                        bad == 0 ? "ok" : "FAILED"));
        f.big = Tensor();
        f.small = Tensor();
        out.push_back(std::move(r));
      }
    }
  }
  return out;
}

void add_comm_shares(nlohmann::json& results, const nlohmann::json& machine) {
  const double bw = machine.value("memory_gbytes_per_s", 0.0);
  for (nlohmann::json& r : results) {
    if (r.value("suite", "") != "comm" || r.value("device", "") != "cpu" || bw <= 0) continue;
    r["bandwidth_share"] = r["busbw_gbytes_per_s"].get<double>() / bw;
  }
}

}  // namespace dtrain::runtime
