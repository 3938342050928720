// bench_dense: GFLOP/s of the CPU GEMM (2048^3 f32) and of a ResNet 3x3
// convolution (N32 C64 56x56 K64 pad 1) forward, backward-data and
// backward-filter, as JSON with the fraction of the machine's FMA peak.
// Usage: bench_dense [--threads N] [--reps N]. Not a correctness test.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "core/parallel.h"
#include "kernels/conv.h"
#include "kernels/gemm.h"

namespace {

using namespace dtrain;

constexpr double kPeakGflops = 415.0;  // measured fp32 FMA peak, 2 Zen 5 cores (PLATFORM.md)

// This machine's fp32 FMA rate now: 12 independent 16-lane FMA chains per
// thread (enough to cover latency), so the kernels' fractions can be read
// against what the (possibly shared) cores deliver today.
double measured_peak_gflops(int threads) {
#if defined(__AVX512F__)
  constexpr long kIters = 50'000'000;
  float sink = 0.0f;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * i);
    const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
    }
    alignas(64) float lanes[16];
    for (int i = 0; i < 12; ++i) {
      _mm512_store_ps(lanes, acc[i]);
      sink += lanes[0];
    }
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sink == 0.0f ? 0.0 : threads * kIters * 12.0 * 16 * 2 / sec / 1e9;
#else
  (void)threads;
  return 0.0;
#endif
}

// Median seconds of `reps` timed runs after one warm-up run.
double median_seconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor filled(const Shape& s, float scale) {
  Tensor t = Tensor::empty(s, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * static_cast<float>((i * 7919) % 97 - 48);
  return t;
}

// Caller-owned workspace, 64-byte aligned.
struct Scratch {
  void* mem = nullptr;
  size_t bytes = 0;
  explicit Scratch(size_t n) : mem(std::aligned_alloc(64, (n + 64) / 64 * 64)), bytes(n) {}
  ~Scratch() { std::free(mem); }
  kernels::Workspace ws() const { return {mem, bytes}; }
};

double gemm_gflops(int reps) {
  kernels::GemmArgs g;
  g.m = g.n = g.k = 2048;
  Tensor a = filled({2048, 2048}, 1e-3f), b = filled({2048, 2048}, 1e-3f);
  Tensor c = Tensor::empty({2048, 2048}, DType::f32);
  Scratch s(kernels::gemm_workspace_bytes(g, DType::f32, DType::f32));
  const double sec = median_seconds(reps, [&] { kernels::gemm(g, a, b, c, s.ws()); });
  return 2.0 * 2048.0 * 2048.0 * 2048.0 / sec / 1e9;
}

struct ConvFigures {
  double fwd, bwd_data, bwd_filter;
};

ConvFigures conv_gflops(int reps) {
  kernels::Conv2dArgs a;
  a.n = 32, a.c = 64, a.h = 56, a.w = 56, a.k = 64, a.r = 3, a.s = 3, a.pad_h = a.pad_w = 1;
  Tensor x = filled({a.n, a.c, a.h, a.w}, 1e-2f), w = filled({a.k, a.c, a.r, a.s}, 1e-2f);
  Tensor y = filled({a.n, a.k, a.out_h(), a.out_w()}, 1e-2f);
  Tensor dx = Tensor::empty(x.shape(), DType::f32), dw = Tensor::empty(w.shape(), DType::f32);
  Scratch s(kernels::conv2d_workspace_bytes(a, DType::f32));
  const double flops = a.flops() / 1e9;
  return {
      flops / median_seconds(reps, [&] { kernels::conv2d_forward(a, x, w, y, s.ws()); }),
      flops / median_seconds(reps, [&] { kernels::conv2d_backward_data(a, y, w, dx, s.ws()); }),
      flops / median_seconds(reps, [&] { kernels::conv2d_backward_filter(a, x, y, dw, s.ws()); })};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(5, std::atoi(argv[i + 1]));
  }
  dtrain::set_num_threads(threads);
  const double gemm = gemm_gflops(reps);
  const ConvFigures conv = conv_gflops(reps);
  const double measured = measured_peak_gflops(dtrain::num_threads());
  std::printf(
      "{\"threads\": %d, \"reps\": %d, \"peak_gflops\": %.0f, \"measured_fma_peak_gflops\": %.1f,\n"
      " \"gemm_2048_f32_gflops\": %.1f, \"gemm_2048_f32_peak_fraction\": %.3f,\n"
      " \"conv3x3_fwd_gflops\": %.1f, \"conv3x3_fwd_peak_fraction\": %.3f,\n"
      " \"conv3x3_bwd_data_gflops\": %.1f, \"conv3x3_bwd_data_peak_fraction\": %.3f,\n"
      " \"conv3x3_bwd_filter_gflops\": %.1f, \"conv3x3_bwd_filter_peak_fraction\": %.3f}\n",
      dtrain::num_threads(), reps, kPeakGflops, measured, gemm, gemm / kPeakGflops, conv.fwd,
      conv.fwd / kPeakGflops, conv.bwd_data, conv.bwd_data / kPeakGflops, conv.bwd_filter,
      conv.bwd_filter / kPeakGflops);
  return 0;
}
