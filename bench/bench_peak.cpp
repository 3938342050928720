// bench_peak: this machine's measured arithmetic peak and memory bandwidth on all OpenMP
// threads, as JSON, for the denominators of "fraction of peak" figures
// (scripts/bench-precision.sh). The measurement is kernels::measure_host_peak
// (kernels/cpu/peak.cpp: what each path runs), the one `dtrain estimate`'s roofline uses,
// here with longer runs (best of 3 of about 0.25 s each):
//   fp32_fma_gflops         avx512f FMA chains
//   bf16_dp_gflops          avx512_bf16 vdpbf16ps chains
//   amx_bf16_gflops         AMX tdpbf16ps tiles
//   bf16_peak_gflops        the best bf16 path, named by bf16_peak_path
//   triad_gbytes_per_s      a = b + s c over ~256 MB (STREAM's triad byte count)
// A path the CPU (or the kernel, for AMX's tile state) lacks prints null.
// Usage: bench_peak [--threads N] [--seconds S] (defaults: OpenMP's thread count, 0.25 s
// per run; 0.03 is what `dtrain estimate` measures with). Not a test.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/parallel.h"
#include "kernels/peak.h"

namespace {

std::string giga(double v) {
  if (v <= 0.0) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v / 1e9);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = dtrain::num_threads();
  double seconds = 0.25;
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[i + 1]));
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::max(1e-3, std::atof(argv[i + 1]));
    } else {
      std::fprintf(stderr, "bench_peak: usage: bench_peak [--threads N] [--seconds S]\n");
      return 2;
    }
  }
  const dtrain::kernels::HostPeak p =
      dtrain::kernels::measure_host_peak(threads, seconds, dtrain::kernels::PeakPaths::all);
  const std::string path = p.bf16_path.empty() ? "null" : "\"" + p.bf16_path + "\"";
  std::printf(
      "{\"threads\": %d, \"fp32_fma_gflops\": %s, \"bf16_dp_gflops\": %s, "
      "\"amx_bf16_gflops\": %s, \"bf16_peak_gflops\": %s, \"bf16_peak_path\": %s, "
      "\"triad_gbytes_per_s\": %s}\n",
      p.threads, giga(p.fp32_flops).c_str(), giga(p.bf16_dp_flops).c_str(),
      giga(p.amx_bf16_flops).c_str(), giga(p.bf16_flops).c_str(), path.c_str(),
      giga(p.bytes_per_s).c_str());
  return 0;
}
