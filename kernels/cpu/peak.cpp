// The host's measured peaks (kernels/peak.h), on all OpenMP threads:
//   fp32      avx512f vfmadd231ps zmm: 12 independent chains, 32 flops per instruction
//             (without AVX-512: avx2 vfmadd231ps ymm, 16 flops per instruction)
//   bf16 dp   avx512_bf16 vdpbf16ps zmm: 12 independent chains, 32 bf16 pairs,
//             64 flops per instruction
//   AMX bf16  amx_bf16 tdpbf16ps: 4 independent 16x16 f32 accumulator tiles, each
//             += 16x32 . 32x16 bf16 (16384 flops per instruction)
//   bytes     a = b + s c over three f32 arrays of ~85 MB each (STREAM's triad; write
//             allocation not counted, as the roofline counts tensor bytes)
// The compute chains touch no memory, so they are the cores' ceiling, not a GEMM's.
// Each path is compiled for its ISA by a target attribute and runs only when cpuid,
// XCR0 (and for AMX the kernel's permission) say it may; the others stay 0.
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "core/parallel.h"
#include "kernels/peak.h"

namespace dtrain::kernels {
namespace {

using Clock = std::chrono::steady_clock;

// A sanitizer build instruments these loops (the chains' accumulators go to the stack,
// every triad access is checked) and would measure a tenth of the peak; the kernels
// touch only their own registers and arrays, so they run uninstrumented in any build.
#define DTRAIN_PEAK_KERNEL __attribute__((no_sanitize("address", "undefined")))

// ---- What the CPU and the OS support (cpuid, xgetbv) --------------------------------------

struct Features {
  bool avx2_fma = false, avx512f = false, avx512_bf16 = false, amx_tile = false;
  bool amx_bf16 = false;
  bool os_ymm = false;  // XCR0: SSE and AVX state enabled
  bool os_zmm = false;  // XCR0: opmask, ZMM_Hi256 and Hi16_ZMM state enabled
};

__attribute__((target("xsave"))) uint64_t xcr0() { return _xgetbv(0); }

Features detect() {
  Features f;
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12);
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2_fma = fma && (b & (1u << 5));
  f.avx512f = b & (1u << 16);
  f.amx_bf16 = d & (1u << 22);
  f.amx_tile = d & (1u << 24);
  const unsigned max_sub = a;
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = a & (1u << 5);
  }
  f.os_ymm = osxsave && (xcr0() & 0x6) == 0x6;
  f.os_zmm = osxsave && (xcr0() & 0xe6) == 0xe6;
  return f;
}

// Linux keeps AMX tile data off until the process asks for it (kernel 5.16+).
bool request_amx() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// ---- Per-thread kernels: `iters` loop trips, a value that depends on every result ----------

constexpr int kChains = 12;

DTRAIN_PEAK_KERNEL __attribute__((target("avx512f"))) float fp32_fma(long iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * i);
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  alignas(64) float lanes[16];
  float s = 0.0f;
  for (int i = 0; i < kChains; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    s += lanes[0] + lanes[15];
  }
  return s;
}
constexpr double kFp32FlopsPerIter = kChains * 16 * 2;

DTRAIN_PEAK_KERNEL __attribute__((target("avx2,fma"))) float fp32_fma_ymm(long iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-3f * i);
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  alignas(32) float lanes[8];
  float s = 0.0f;
  for (int i = 0; i < kChains; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    s += lanes[0] + lanes[7];
  }
  return s;
}
constexpr double kFp32YmmFlopsPerIter = kChains * 8 * 2;

DTRAIN_PEAK_KERNEL __attribute__((target("avx512f,avx512bf16"))) float bf16_dp(long iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * i);
  // Small products: each instruction adds +-2e-6 to a lane, far from overflow or denormals.
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(-1e-3f), _mm512_set1_ps(1e-3f));
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  }
  alignas(64) float lanes[16];
  float s = 0.0f;
  for (int i = 0; i < kChains; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    s += lanes[0] + lanes[15];
  }
  return s + 1.0f;
}
constexpr double kBf16DpFlopsPerIter = kChains * 32 * 2;

// Palette 1: tiles 0-3 are 16x16 f32 accumulators, 4-5 the A operands (16 rows x 32 bf16),
// 6-7 the B operands (16 rows of 16 bf16 pairs); every tile 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "palette config is 64 bytes");

DTRAIN_PEAK_KERNEL __attribute__((target("amx-tile,amx-bf16"))) float amx_bf16(long iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t ops[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) ops[i] = 0x3a83;  // bf16 ~1e-3
  alignas(64) float out[16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ops, 64);
  _tile_loadd(5, ops, 64);
  _tile_loadd(6, ops, 64);
  _tile_loadd(7, ops, 64);
  for (long it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float s = 0.0f;
  _tile_stored(0, out, 64);
  s += out[0];
  _tile_stored(3, out, 64);
  s += out[255];
  _tile_release();
  return s;
}
constexpr double kAmxFlopsPerIter = 4 * 2.0 * 16 * 16 * 32;

// ---- Timing -------------------------------------------------------------------------------

// Seconds for every thread to run `iters` trips of `kernel` (one parallel region).
double run_once(int threads, float (*kernel)(long), long iters) {
  float sink = 0.0f;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += kernel(iters);
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  // The sum keeps the chains alive; it is never zero for these inputs.
  if (sink == 0.0f) std::fprintf(stderr, "dtrain: peak measurement: unexpected zero sum\n");
  return sec;
}

// FLOP/s of all threads: calibrate to `seconds` per run, best of 3 runs. The first run
// only wakes the threads (and AMX's power-up). A calibration run is the faster of two and
// lasts at least 15 ms, and the measured runs never shrink below it: on a busy machine a
// parallel region of any length can cost a scheduler time slice, and runs that short
// would measure the fork and join, not the chains.
double peak_flops(int threads, float (*kernel)(long), double flops_per_iter, double seconds) {
  long iters = 1000;
  run_once(threads, kernel, iters);
  auto calibrate = [&] {
    return std::min(run_once(threads, kernel, iters), run_once(threads, kernel, iters));
  };
  const double enough = std::clamp(seconds / 2, 0.015, 0.02);
  double sec = calibrate();
  while (sec < enough) {  // aim a little past `enough`, at most 8x a step
    iters = static_cast<long>(iters * std::clamp(1.3 * enough / std::max(sec, 1e-6), 2.0, 8.0));
    sec = calibrate();
  }
  iters = std::max(iters, static_cast<long>(iters * seconds / sec));
  double best = 1e30;
  for (int r = 0; r < 3; ++r) best = std::min(best, run_once(threads, kernel, iters));
  return threads * static_cast<double>(iters) * flops_per_iter / best;
}

// Triad over three arrays of n floats, each thread over its own part, so it first-touches
// (and later streams) its own pages; best of up to 4 passes within the time asked for.
// Plain 4 kB pages: asking for huge pages made the first touch faster on average here,
// but now and then ten times slower (the kernel assembling 2 MB pages).
DTRAIN_PEAK_KERNEL void triad(float* a, const float* b, const float* c, float s, int64_t lo,
                              int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}

// Each thread's contiguous part of [0, n), as schedule(static) would cut it.
template <typename Fn>
void over_parts(int threads, int64_t n, Fn&& fn) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), parts = omp_get_num_threads();
    const int64_t len = (n + parts - 1) / parts;
    fn(std::min(n, t * len), std::min(n, (t + 1) * len));
  }
}

double triad_bytes_per_s(int threads, double seconds) {
  constexpr int64_t n = (256 << 20) / 3 / sizeof(float);
  std::unique_ptr<float[]> buf(new float[3 * n]);
  float* pa = buf.get();
  float* pb = pa + n;
  float* pc = pb + n;
  over_parts(threads, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) pa[i] = 0.0f, pb[i] = 1.0f, pc[i] = 2.0f;
  });
  const float s = 0.5f;
  double best = 1e30, spent = 0;
  for (int r = 0; r < 4 && (r < 2 || spent < seconds); ++r) {
    const auto t0 = Clock::now();
    over_parts(threads, n, [&](int64_t lo, int64_t hi) { triad(pa, pb, pc, s, lo, hi); });
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, sec);
    spent += sec;
  }
  if (pa[n / 2] != 2.0f) std::fprintf(stderr, "dtrain: bandwidth measurement: wrong triad\n");
  return 3.0 * sizeof(float) * static_cast<double>(n) / best;
}

}  // namespace

HostPeak measure_host_peak(int threads, double seconds_per_run, PeakPaths paths) {
  HostPeak p;
  p.threads = std::max(1, threads);
  const Features f = detect();
  const bool zmm = f.avx512f && f.os_zmm;
  if (zmm) {
    p.fp32_flops = peak_flops(p.threads, fp32_fma, kFp32FlopsPerIter, seconds_per_run);
    p.fp32_path = "avx512f";
  } else if (f.avx2_fma && f.os_ymm) {
    p.fp32_flops = peak_flops(p.threads, fp32_fma_ymm, kFp32YmmFlopsPerIter, seconds_per_run);
    p.fp32_path = "avx2_fma";
  }
  const bool amx = f.amx_tile && f.amx_bf16 && request_amx();
  if (f.amx_tile && f.amx_bf16 && !amx)
    std::fprintf(stderr, "dtrain: the kernel refused AMX tile data (arch_prctl)\n");
  if (zmm && f.avx512_bf16 && (paths == PeakPaths::all || !amx))
    p.bf16_dp_flops = peak_flops(p.threads, bf16_dp, kBf16DpFlopsPerIter, seconds_per_run);
  if (amx) p.amx_bf16_flops = peak_flops(p.threads, amx_bf16, kAmxFlopsPerIter, seconds_per_run);
  p.bf16_flops = std::max(p.bf16_dp_flops, p.amx_bf16_flops);
  if (p.bf16_flops > 0)
    p.bf16_path = p.amx_bf16_flops >= p.bf16_dp_flops ? "amx_bf16" : "avx512_bf16_dp";
  p.bytes_per_s = triad_bytes_per_s(p.threads, seconds_per_run * 4);
  return p;
}

const HostPeak& measured_host_peak() {
  // About 0.1 s per compute path and 0.15 s for the triads and their first touch.
  static const HostPeak peak = measure_host_peak(num_threads(), 0.02, PeakPaths::fastest);
  return peak;
}

}  // namespace dtrain::kernels
