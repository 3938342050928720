// bench_peak: this machine's measured arithmetic peak on all OpenMP threads, as JSON,
// for the denominators of "fraction of peak" figures (scripts/bench-precision.sh):
//   fp32_fma_gflops  avx512f vfmadd231ps zmm: 12 independent chains, 32 flops per instruction
//   bf16_dp_gflops   avx512_bf16 vdpbf16ps zmm: 12 independent chains, 32 bf16 pairs,
//                    64 flops per instruction
//   amx_bf16_gflops  amx_bf16 tdpbf16ps: 4 independent 16x16 f32 accumulator tiles, each
//                    += 16x32 . 32x16 bf16 (16384 flops per instruction)
// A path the CPU (or the kernel, for AMX's tile state) lacks prints null. bf16_peak_gflops
// is the best bf16 path and bf16_peak_path names it. Each path: best of 3 runs of about
// 0.25 s after a calibration, so the figure is what the (possibly shared) cores deliver
// now. Usage: bench_peak [--threads N] (default: OpenMP's thread count). Not a test.
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/parallel.h"

namespace {

using Clock = std::chrono::steady_clock;

// ---- What the CPU and the OS support (cpuid, xgetbv) --------------------------------------

struct Features {
  bool avx512f = false, avx512_bf16 = false, amx_tile = false, amx_bf16 = false;
  bool os_zmm = false;  // XCR0: opmask, ZMM_Hi256 and Hi16_ZMM state enabled
};

__attribute__((target("xsave"))) uint64_t xcr0() { return _xgetbv(0); }

Features detect() {
  Features f;
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = c & (1u << 27);
  __cpuid_count(7, 0, a, b, c, d);
  f.avx512f = b & (1u << 16);
  f.amx_bf16 = d & (1u << 22);
  f.amx_tile = d & (1u << 24);
  const unsigned max_sub = a;
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = a & (1u << 5);
  }
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

__attribute__((target("avx512f"))) float fp32_fma(long iters) {
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

__attribute__((target("avx512f,avx512bf16"))) float bf16_dp(long iters) {
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

__attribute__((target("amx-tile,amx-bf16"))) float amx_bf16(long iters) {
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
  if (sink == 0.0f) std::fprintf(stderr, "bench_peak: unexpected zero sum\n");
  return sec;
}

// GFLOP/s of all threads: calibrate to ~0.25 s per run, best of 3 runs.
double peak_gflops(int threads, float (*kernel)(long), double flops_per_iter) {
  long iters = 1000;
  double sec = run_once(threads, kernel, iters);
  while (sec < 0.02) {
    iters *= 8;
    sec = run_once(threads, kernel, iters);
  }
  iters = std::max(1L, static_cast<long>(iters * 0.25 / sec));
  double best = 1e30;
  for (int r = 0; r < 3; ++r) best = std::min(best, run_once(threads, kernel, iters));
  return threads * static_cast<double>(iters) * flops_per_iter / best / 1e9;
}

std::string num(double v) {
  if (v <= 0.0) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = dtrain::num_threads();
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "bench_peak: usage: bench_peak [--threads N]\n");
      return 2;
    }
  }
  const Features f = detect();
  const bool zmm = f.avx512f && f.os_zmm;
  double fp32 = 0.0, dp = 0.0, amx = 0.0;
  if (zmm) fp32 = peak_gflops(threads, fp32_fma, kFp32FlopsPerIter);
  if (zmm && f.avx512_bf16) dp = peak_gflops(threads, bf16_dp, kBf16DpFlopsPerIter);
  if (f.amx_tile && f.amx_bf16) {
    if (request_amx())
      amx = peak_gflops(threads, amx_bf16, kAmxFlopsPerIter);
    else
      std::fprintf(stderr, "bench_peak: the kernel refused AMX tile data (arch_prctl)\n");
  }
  const double bf16 = std::max(dp, amx);
  const char* path = bf16 <= 0.0 ? "null" : amx >= dp ? "\"amx_bf16\"" : "\"avx512_bf16_dp\"";
  std::printf(
      "{\"threads\": %d, \"fp32_fma_gflops\": %s, \"bf16_dp_gflops\": %s, "
      "\"amx_bf16_gflops\": %s, \"bf16_peak_gflops\": %s, \"bf16_peak_path\": %s}\n",
      threads, num(fp32).c_str(), num(dp).c_str(), num(amx).c_str(), num(bf16).c_str(), path);
  return 0;
}
