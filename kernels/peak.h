// The best this machine's compute and memory can do, for roofline figures
// (`dtrain estimate`'s step time, bench_peak's "fraction of peak" denominators).
// The host's peaks are measured (kernels/cpu/peak.cpp: FMA, bf16 dot-product and AMX
// chains that touch no memory, and a STREAM-like triad); a GPU's come from NVIDIA's
// datasheets (kernels/peak.cpp), never from a measurement, so they say so.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::kernels {

struct HostPeak {
  double fp32_flops = 0;      // FMA chains on all threads; 0: neither AVX-512 nor AVX2 + FMA
  std::string fp32_path;      // "avx512f" or "avx2_fma" (empty when fp32_flops is 0)
  double bf16_dp_flops = 0;   // avx512_bf16 vdpbf16ps; 0: the CPU lacks it (or not asked)
  double amx_bf16_flops = 0;  // AMX tdpbf16ps; 0: the CPU (or the kernel) lacks it
  double bf16_flops = 0;      // the better of the two bf16 paths
  std::string bf16_path;      // "amx_bf16", "avx512_bf16_dp", or empty when neither
  double bytes_per_s = 0;     // triad a = b + s c over ~256 MB, 3 x 4 bytes per element
  int threads = 0;
};

// fastest: the avx512_bf16 dot product is skipped where AMX runs (AMX's tiles, 16384
// flops an instruction against 64, always beat it), so bf16_dp_flops stays 0 there.
enum class PeakPaths : uint8_t { all, fastest };

// Each path on `threads` OpenMP threads, the best of 3 runs of about `seconds_per_run`
// (at least 15 ms; after a calibration), so the figure is what the (possibly shared)
// cores deliver now. bench_peak takes 0.25 s per run; the process-wide one below less.
HostPeak measure_host_peak(int threads, double seconds_per_run, PeakPaths paths);

// Measured once per process on dtrain's thread count (0.3-0.6 s in all: 0.02 s runs,
// PeakPaths::fastest), then cached.
const HostPeak& measured_host_peak();

// Dense (no sparsity) datasheet peaks of one GPU model, per second.
struct GpuDatasheet {
  std::string name;              // "H200 SXM"
  double half_tensor_flops = 0;  // bf16 and fp16 tensor cores, f32 accumulation
  double tf32_tensor_flops = 0;
  double fp32_flops = 0;   // CUDA cores, no tensor core
  double bytes_per_s = 0;  // HBM
  // The host link's per-direction bandwidth (memory.offload.optimizer's transfers): the
  // sheet's PCIe figure, which it states for both directions together.
  double host_link_bytes_per_s = 0;
};

// The sheet of the family `device_name` names (cudaDeviceProp::name, "NVIDIA H100 80GB
// HBM3": H100, H200 or A100); the H200's when it names none of them or is empty (no GPU),
// with `matched` false.
GpuDatasheet gpu_datasheet(const std::string& device_name, bool* matched = nullptr);

}  // namespace dtrain::kernels
