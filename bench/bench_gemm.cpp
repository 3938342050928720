// bench_gemm: throughput of kernels::gemm on one device (the CPU's oneDNN or
// the GPU's cuBLASLt) for one row-major C[m, n] = A[m, k] . B[k, n], as JSON:
// median and best time over --reps timed runs after --warmup, TFLOP/s, and a
// spot check of 16 elements of C against fp64 dot products on the host (so a
// fast but wrong kernel cannot report a number). Not a test; nothing is timed
// in ctest. Usage: bench_gemm [--device cpu|cuda[:N]] [--dtype f32|bf16|f16]
// [--m 8192 --n 8192 --k 8192] [--trans NN|NT|TN|TT] [--bias 0|1] [--c f32|same]
// [--reps 10] [--warmup 3]. --c same: C in the inputs' dtype (a half weight gradient).
// --bias 1: the bias epilogue (C's dtype f32, so f32 bias).
// --trans: whether A is stored [k, m] and B [n, k] (a linear layer's forward is NT,
// its data gradient NN, its weight gradient TN).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/memory.h"

namespace {

using namespace dtrain;
using Clock = std::chrono::steady_clock;

struct Args {
  Device device = Device::cpu();
  DType dtype = DType::bf16;
  int64_t m = 8192, n = 8192, k = 8192;
  int reps = 10, warmup = 3;
  bool ta = false, tb = false, bias = false;
  bool c_same = false;  // --c same: C (and the bias) in the inputs' dtype, else f32
};

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  throw Error("--dtype " + s + " is not f32, bf16 or f16", "pass --dtype bf16");
}

int64_t positive(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x <= 0) {
    throw Error("" + flag + " expects a positive integer, got \"" + v + "\"",
                "e.g. " + flag + " 4096");
  }
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw Error("" + k + " needs a value", "see the usage line");
    const std::string v = argv[i + 1];
    if (k == "--device")
      a.device = Device::parse(v);
    else if (k == "--dtype")
      a.dtype = parse_dtype(v);
    else if (k == "--m")
      a.m = positive(k, v);
    else if (k == "--n")
      a.n = positive(k, v);
    else if (k == "--k")
      a.k = positive(k, v);
    else if (k == "--trans") {
      if (v.size() != 2 || (v[0] != 'N' && v[0] != 'T') || (v[1] != 'N' && v[1] != 'T'))
        throw Error("--trans " + v + " is not NN, NT, TN or TT", "e.g. --trans NT");
      a.ta = v[0] == 'T', a.tb = v[1] == 'T';
    } else if (k == "--bias") {
      if (v != "0" && v != "1") throw Error("--bias " + v + " is not 0 or 1", "e.g. --bias 1");
      a.bias = v == "1";
    } else if (k == "--c") {
      if (v != "f32" && v != "same")
        throw Error("--c " + v + " is not f32 or same", "e.g. --c same");
      a.c_same = v == "same";
    } else if (k == "--reps")
      a.reps = static_cast<int>(positive(k, v));
    else if (k == "--warmup")
      a.warmup = static_cast<int>(std::max<int64_t>(0, std::atoll(v.c_str())));
    else
      throw Error("unknown option " + k, "see the usage line in bench_gemm.cpp");
  }
  return a;
}

// Uniform values in [-1, 1) rounded to `dtype`, made on the host as f32 then cast.
Tensor host_random(int64_t rows, int64_t cols, DType dtype, uint64_t stream) {
  Tensor f = Tensor::empty({rows, cols}, DType::f32);
  const Philox rng(7, stream);
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i)
    p[i] = 2.0f * rng.uniform(static_cast<uint64_t>(i)) - 1.0f;
  Tensor t = Tensor::empty({rows, cols}, dtype);
  kernels::cast(f, t);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    Allocator& dev = kernels::device_allocator(a.device);
    const Tensor ha = a.ta ? host_random(a.k, a.m, a.dtype, 1) : host_random(a.m, a.k, a.dtype, 1);
    const Tensor hb = a.tb ? host_random(a.n, a.k, a.dtype, 2) : host_random(a.k, a.n, a.dtype, 2);
    Tensor A = Tensor::empty(ha.shape(), a.dtype, &dev),
           B = Tensor::empty(hb.shape(), a.dtype, &dev);
    const DType c_dtype = a.c_same ? a.dtype : DType::f32;
    Tensor C = Tensor::empty({a.m, a.n}, c_dtype, &dev);
    kernels::copy(ha, A);
    kernels::copy(hb, B);
    const Tensor hbias = host_random(1, a.n, DType::f32, 3);
    Tensor bias;
    if (a.bias) {
      Tensor hb_c = Tensor::empty({a.n}, c_dtype);
      kernels::cast(hbias.reshape({a.n}), hb_c);
      bias = Tensor::empty({a.n}, c_dtype, &dev);
      kernels::copy(hb_c, bias);
    }
    kernels::GemmArgs g;
    g.m = a.m, g.n = a.n, g.k = a.k;
    g.trans_a = a.ta ? kernels::Trans::yes : kernels::Trans::no;
    g.trans_b = a.tb ? kernels::Trans::yes : kernels::Trans::no;
    if (a.bias) g.epilogue = kernels::Epilogue::bias;
    const size_t ws_bytes = kernels::gemm_workspace_bytes(g, a.dtype, c_dtype, a.device);
    Tensor ws_t =
        Tensor::empty({static_cast<int64_t>(std::max<size_t>(ws_bytes, 1))}, DType::u8, &dev);
    const kernels::Workspace ws{ws_t.raw(), ws_bytes};

    std::vector<double> times;
    for (int r = 0; r < a.warmup + a.reps; ++r) {
      kernels::synchronize(a.device);
      const auto t0 = Clock::now();
      kernels::gemm(g, A, B, C, ws, bias);
      kernels::synchronize(a.device);
      if (r >= a.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2], best = times.front();
    const double flop = 2.0 * static_cast<double>(a.m) * static_cast<double>(a.n) * a.k;

    // Spot check: 16 elements of C against fp64 dot products of the same inputs.
    Tensor hc_raw = Tensor::empty(C.shape(), c_dtype), hc = Tensor::empty(C.shape(), DType::f32);
    kernels::copy(C, hc_raw);
    kernels::cast(hc_raw, hc);
    Tensor fa = Tensor::empty(ha.shape(), DType::f32), fb = Tensor::empty(hb.shape(), DType::f32);
    kernels::cast(ha, fa);
    kernels::cast(hb, fb);
    double worst = 0.0;
    const Philox pick(11, 0);
    for (uint64_t s = 0; s < 16; ++s) {
      const int64_t i = pick.u32(2 * s) % a.m, j = pick.u32(2 * s + 1) % a.n;
      double dot = a.bias ? hbias.data<float>()[j] : 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < a.k; ++kk) {
        const double x = fa.data<float>()[a.ta ? kk * a.m + i : i * a.k + kk];
        const double y = fb.data<float>()[a.tb ? j * a.k + kk : kk * a.n + j];
        dot += x * y;
        mag += std::fabs(x * y);
      }
      worst =
          std::max(worst, std::fabs(hc.data<float>()[i * a.n + j] - dot) / std::max(mag, 1e-30));
    }
    // f32 accumulation over k terms, relative to sum |a b|; a half C adds its rounding.
    const bool ok = worst < (c_dtype == DType::f32 ? 1e-3 : 1e-2);
    const nlohmann::json out = {{"device", a.device.str()},
                                {"dtype", std::string(dtype_name(a.dtype))},
                                {"m", a.m},
                                {"n", a.n},
                                {"k", a.k},
                                {"trans", std::string(a.ta ? "T" : "N") + (a.tb ? "T" : "N")},
                                {"bias", a.bias},
                                {"reps", a.reps},
                                {"median_ms", median * 1e3},
                                {"best_ms", best * 1e3},
                                {"tflops_median", flop / median / 1e12},
                                {"tflops_best", flop / best / 1e12},
                                {"spot_check_max_rel_error", worst},
                                {"spot_check_ok", ok}};
    std::printf("%s\n", out.dump(2).c_str());
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 2;
  }
}
