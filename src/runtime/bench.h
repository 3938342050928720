// `dtrain bench`: the machine (measured FMA peaks, memory bandwidth, library versions)
// and suites of timed figures, each with its spread and its share of the machine's
// peak, as one JSON document (schema in docs/bench.md); and the comparison of two such
// documents that `dtrain bench --compare` prints and gates on.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "dist/options.h"

namespace dtrain::dist {
class Communicator;
}

namespace dtrain::runtime {

struct BenchOptions {
  Device device = Device::cpu();
  std::vector<DType> dtypes = {DType::f32};
  double min_seconds = 0.3;  // per figure, at least (after a warm-up run)
  double max_seconds = 3.0;  // per figure, at most (the spread is then what it is)
  std::string only;          // run the figures whose name contains this ("" = all)
};

// The median of repeated runs and the spread around it. Runs repeat until at least 5
// and min_seconds are done and the spread is under 5%, or max_seconds or 50 runs.
struct Timing {
  int runs = 0;
  double median = 0, p10 = 0, p90 = 0;
  std::vector<double> samples;  // every run, in order
  double spread() const { return median > 0 ? (p90 - p10) / median : 0; }
};
// The median and spread of given samples (seconds).
Timing timing_of(const std::vector<double>& seconds);
// Samples (seconds) taken until the rule above stops; `sample` runs and times one run.
// Every rank of a group stops together when each sample is the same on every rank.
Timing time_samples(const std::function<double()>& sample, const BenchOptions& o);
// `fn` once to warm up, then timed as above; `sync` ends each run (the device's work).
Timing time_repeated(const std::function<void()>& fn, const std::function<void()>& sync,
                     const BenchOptions& o);

// The machine section: CPU, threads, measured peaks (fp32 and bf16 FMA, triad
// bandwidth), library versions, and on CUDA the device with its datasheet peaks.
nlohmann::json bench_machine(const BenchOptions& o);

// The peak a `dt` figure is measured against, GFLOP/s: the GPU's section on CUDA, else
// the host's; bf16 where there is a bf16 path, else fp32 (oneDNN then widens bf16).
double bench_peak_gflops(const nlohmann::json& machine, DType dt);

// GEMM and convolution at the shapes the built-in models use, attention and layer norm:
// per figure its seconds, GFLOP/s (or GB/s) and share of the machine's peak, and a
// check of sampled outputs against fp64 sums. `progress` gets a line per figure.
nlohmann::json bench_kernels(const BenchOptions& o, const nlohmann::json& machine,
                             const std::function<void(const std::string&)>& progress);

// The comm suite: all-reduce per algorithm (native, ring, and hierarchical when the
// ranks sit on several nodes of equal size, or those asked for), reduce-scatter and
// all-gather, for buffers of min_bytes, 4 x min_bytes, ... up to max_bytes. Collective:
// every rank of `host` calls it; `comm` is the communicator timed (`host` itself, or
// NCCL over it), `host` agrees on the times (each run after a barrier; a run's time is
// the slowest rank's). Per figure its seconds with spread, algorithm and bus bandwidth
// (busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for the other two, as NVIDIA's
// nccl-tests count it), all-reduce's speed against native, and a check of the sums.
// The result is the same JSON on every rank; `progress` is called on rank 0 only.
struct CommBenchOptions {
  int64_t min_bytes = 4096;
  int64_t max_bytes = int64_t{64} << 20;
  std::vector<AllreduceAlgo> algorithms;  // empty: the ones that apply (above)
};
nlohmann::json bench_comm(dist::Communicator& host, dist::Communicator& comm, const BenchOptions& o,
                          const CommBenchOptions& c,
                          const std::function<void(const std::string&)>& progress);
// Each comm figure's bus bandwidth as a share of the machine's measured memory
// bandwidth (ranks on one host move their bytes through memory), where it was measured.
void add_comm_shares(nlohmann::json& results, const nlohmann::json& machine);

// Baseline against now, figure by figure (matched by suite, name, dtype and device):
// the table's rows and whether any figure is slower than 1 + threshold times the
// baseline's median time.
struct BenchComparison {
  struct Row {
    std::string key;
    double baseline = 0, now = 0, ratio = 0;  // seconds; ratio = now / baseline
    bool slower = false;
  };
  std::vector<Row> rows;
  std::vector<std::string> missing;  // in the baseline, not measured now
  bool any_slower = false;
};
BenchComparison compare_bench(const nlohmann::json& baseline, const nlohmann::json& now,
                              double threshold);
std::string format_comparison(const BenchComparison& c, double threshold);

}  // namespace dtrain::runtime
