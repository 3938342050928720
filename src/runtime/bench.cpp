// See bench.h. Inputs are uniform in [-1, 1) from a fixed LCG (rounded to the dtype,
// and the references read the rounded values); each figure's check recomputes a few
// sampled outputs as fp64 sums and measures the error against the sum of the terms'
// magnitudes (a scale that does not vanish when the terms cancel).
#include "runtime/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "dist/mpi_info.h"
#include "kernels/attention.h"
#include "kernels/conv.h"
#include "kernels/device_info.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/memory.h"
#include "kernels/peak.h"

namespace dtrain::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// A tensor of `shape` on the bench's device, uniform in [-1, 1), and its values as
// the kernel sees them (rounded to `dtype`) on the host.
struct Operand {
  Tensor t;
  std::vector<float> host;
};

Operand operand(const Shape& shape, DType dtype, Device device, uint32_t seed) {
  Tensor h = Tensor::empty(shape, dtype);
  Operand o;
  o.host.resize(static_cast<size_t>(shape.numel()));
  uint32_t state = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    const float v = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
    if (dtype == DType::bf16) {
      h.data<bf16>()[i] = to_bf16(v);
      o.host[static_cast<size_t>(i)] = to_f32(h.data<bf16>()[i]);
    } else {
      h.data<float>()[i] = v;
      o.host[static_cast<size_t>(i)] = v;
    }
  }
  o.t = Tensor::empty(shape, dtype, &kernels::device_allocator(device));
  kernels::copy(h, o.t);
  return o;
}

Tensor output(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, dtype, &kernels::device_allocator(device));
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = kernels::to_host(t);
  std::vector<float> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) {
    v[static_cast<size_t>(i)] =
        h.dtype() == DType::bf16 ? to_f32(h.data<bf16>()[i]) : h.data<float>()[i];
  }
  return v;
}

struct Workspace {
  Tensor mem;
  kernels::Workspace ws;
  Workspace(size_t bytes, Device device) {
    mem = Tensor::empty(Shape{static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::u8,
                        &kernels::device_allocator(device));
    ws = {mem.raw(), bytes, device};
  }
};

// The sampled check: |got - want| / sum |terms| over the samples, worst case.
struct Check {
  int samples = 0;
  double worst = 0;
  void add(double got, double want, double magnitude) {
    ++samples;
    worst = std::max(worst, std::fabs(got - want) / std::max(magnitude, 1e-30));
  }
  nlohmann::json json(double tolerance) const {
    return {{"samples", samples},
            {"max_error", worst},
            {"tolerance", tolerance},
            {"ok", worst <= tolerance}};
  }
};

const char* dname(DType t) { return t == DType::bf16 ? "bf16" : "fp32"; }

struct Figure {
  std::string name, shape;
  double flops = 0, bytes = 0;  // per run: compute-bound figures have flops, the others bytes
  std::function<void()> run;
  std::function<Check()> check;
  double tolerance = 0;
};

uint32_t pick(uint32_t& state, int64_t n) {
  state = state * 1664525u + 1013904223u;
  return static_cast<uint32_t>((state >> 8) % static_cast<uint32_t>(n));
}

// As a linear layer's forward computes it: x [m, k] times the weight [n, k] (out, in)
// transposed (NT). Until 2026-12-06 B lay [k, n] (NN), a layout no model multiplies in:
// GPT-2's head ran 62 ms there on Zen 5 against 42 ms as the model runs it.
Figure gemm_figure(const std::string& name, int64_t m, int64_t n, int64_t k, DType dt, Device d) {
  auto a = std::make_shared<Operand>(operand(Shape{m, k}, dt, d, 1));
  auto b = std::make_shared<Operand>(operand(Shape{n, k}, dt, d, 2));
  auto c = std::make_shared<Tensor>(output(Shape{m, n}, DType::f32, d));
  kernels::GemmArgs args;
  args.m = m, args.n = n, args.k = k;
  args.trans_b = kernels::Trans::yes;
  auto ws = std::make_shared<Workspace>(kernels::gemm_workspace_bytes(args, dt, DType::f32, d), d);
  Figure f;
  f.name = "gemm/" + name;
  f.shape = fmt::format("M{} N{} K{} NT", m, n, k);
  f.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  f.run = [=] { kernels::gemm(args, a->t, b->t, *c, ws->ws); };
  f.check = [=] {
    const std::vector<float> got = host_floats(*c);
    Check ch;
    uint32_t s = 7;
    for (int i = 0; i < 8; ++i) {
      const int64_t r = pick(s, m), col = pick(s, n);
      double want = 0, mag = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double t = static_cast<double>(a->host[static_cast<size_t>(r * k + l)]) *
                         b->host[static_cast<size_t>(col * k + l)];
        want += t;
        mag += std::fabs(t);
      }
      ch.add(got[static_cast<size_t>(r * n + col)], want, mag);
    }
    return ch;
  };
  f.tolerance = dt == DType::f32 ? 1e-5 : 1e-2;
  return f;
}

// [N, C, H, W] host tensor -> [N, C/B, H, W, B] (the CPU executor's channel-blocked
// activations, graph/layouts.h), any element size.
Tensor channel_blocked(const Tensor& t, int64_t b) {
  const Shape& s = t.shape();
  Tensor out = Tensor::empty(s, t.dtype());
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  const size_t e = dtype_size(t.dtype());
  const auto* in = static_cast<const char*>(t.raw());
  auto* o = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        std::memcpy(o + static_cast<size_t>(((i * (c / b) + ch / b) * hw + p) * b + ch % b) * e,
                    in + static_cast<size_t>((i * c + ch) * hw + p) * e, e);
  return out;
}

// 3x3 or 1x1, stride 1, "same" padding: forward, backward-data or backward-filter. On the
// CPU the activations lie as the executor keeps a ResNet's (channel-blocked where this
// CPU's oneDNN computes in a block, kernels::cpu_channel_block(dtype); "NCHW16c" in the shape),
// so no reorder is timed that a model does not run; until 2026-12-06 they were NCHW.
Figure conv_figure(const std::string& name, const std::string& dir, int64_t nb, int64_t ch,
                   int64_t hw, int64_t kout, int64_t rs, DType dt, Device d) {
  kernels::Conv2dArgs g;
  g.n = nb, g.c = ch, g.h = g.w = hw, g.k = kout, g.r = g.s = rs, g.pad_h = g.pad_w = rs / 2;
  const int64_t b = d.is_cpu() ? kernels::cpu_channel_block(dt) : 0;
  const int64_t block = b > 0 && ch % b == 0 && kout % b == 0 ? b : 0;
  g.x_block = g.y_block = block;
  auto x = std::make_shared<Operand>(operand(Shape{nb, ch, hw, hw}, dt, d, 3));
  auto w = std::make_shared<Operand>(operand(Shape{kout, ch, rs, rs}, dt, d, 4));
  auto dy = std::make_shared<Operand>(operand(Shape{nb, kout, hw, hw}, dt, d, 5));
  if (block > 0) {  // the host copies stay NCHW, for the check
    x->t = channel_blocked(x->t, block);
    dy->t = channel_blocked(dy->t, block);
  }
  auto out = std::make_shared<Tensor>(output(dir == "fwd"        ? Shape{nb, kout, hw, hw}
                                             : dir == "bwd_data" ? Shape{nb, ch, hw, hw}
                                                                 : Shape{kout, ch, rs, rs},
                                             dt, d));
  auto ws = std::make_shared<Workspace>(kernels::conv2d_workspace_bytes(g, dt, d), d);
  Figure f;
  f.name = "conv/" + name + "." + dir;
  f.shape = fmt::format("N{} C{} {}x{} K{} {}x{}{}", nb, ch, hw, hw, kout, rs, rs,
                        block > 0 ? fmt::format(" NCHW{}c", block) : std::string());
  f.flops = g.flops();
  if (dir == "fwd") {
    f.run = [=] { kernels::conv2d_forward(g, x->t, w->t, *out, ws->ws); };
  } else if (dir == "bwd_data") {
    f.run = [=] { kernels::conv2d_backward_data(g, dy->t, w->t, *out, ws->ws); };
  } else {
    f.run = [=] { kernels::conv2d_backward_filter(g, x->t, dy->t, *out, ws->ws); };
  }
  const int64_t pad = rs / 2;
  auto X = [=](int64_t n, int64_t c, int64_t yy, int64_t xx) -> double {
    if (yy < 0 || yy >= hw || xx < 0 || xx >= hw) return 0.0;
    return x->host[static_cast<size_t>(((n * ch + c) * hw + yy) * hw + xx)];
  };
  auto DY = [=](int64_t n, int64_t k, int64_t yy, int64_t xx) -> double {
    if (yy < 0 || yy >= hw || xx < 0 || xx >= hw) return 0.0;
    return dy->host[static_cast<size_t>(((n * kout + k) * hw + yy) * hw + xx)];
  };
  auto W = [=](int64_t k, int64_t c, int64_t r, int64_t s) -> double {
    return w->host[static_cast<size_t>(((k * ch + c) * rs + r) * rs + s)];
  };
  // An NCHW index of an activation with `c` channels where it lies (blocked or not).
  const auto lies = [=](size_t at, int64_t c) {
    if (block == 0) return at;
    const auto i = static_cast<int64_t>(at), plane = hw * hw;
    const int64_t n = i / (c * plane), ch = i / plane % c, p = i % plane;
    return static_cast<size_t>(((n * (c / block) + ch / block) * plane + p) * block + ch % block);
  };
  f.check = [=] {
    const std::vector<float> got = host_floats(*out);
    Check chk;
    uint32_t s = 11;
    for (int i = 0; i < 4; ++i) {
      double want = 0, mag = 0;
      size_t at = 0;
      if (dir == "fwd") {
        const int64_t n = pick(s, nb), k = pick(s, kout), oy = pick(s, hw), ox = pick(s, hw);
        for (int64_t c = 0; c < ch; ++c)
          for (int64_t r = 0; r < rs; ++r)
            for (int64_t q = 0; q < rs; ++q) {
              const double t = X(n, c, oy - pad + r, ox - pad + q) * W(k, c, r, q);
              want += t, mag += std::fabs(t);
            }
        at = lies(static_cast<size_t>(((n * kout + k) * hw + oy) * hw + ox), kout);
      } else if (dir == "bwd_data") {
        const int64_t n = pick(s, nb), c = pick(s, ch), yy = pick(s, hw), xx = pick(s, hw);
        for (int64_t k = 0; k < kout; ++k)
          for (int64_t r = 0; r < rs; ++r)
            for (int64_t q = 0; q < rs; ++q) {
              const double t = DY(n, k, yy + pad - r, xx + pad - q) * W(k, c, r, q);
              want += t, mag += std::fabs(t);
            }
        at = lies(static_cast<size_t>(((n * ch + c) * hw + yy) * hw + xx), ch);
      } else {
        const int64_t k = pick(s, kout), c = pick(s, ch), r = pick(s, rs), q = pick(s, rs);
        for (int64_t n = 0; n < nb; ++n)
          for (int64_t oy = 0; oy < hw; ++oy)
            for (int64_t ox = 0; ox < hw; ++ox) {
              const double t = DY(n, k, oy, ox) * X(n, c, oy - pad + r, ox - pad + q);
              want += t, mag += std::fabs(t);
            }
        at = static_cast<size_t>(((k * ch + c) * rs + r) * rs + q);
      }
      chk.add(got[at], want, mag);
    }
    return chk;
  };
  f.tolerance = dt == DType::f32 ? 1e-5 : 1e-2;
  return f;
}

Figure attention_figure(const std::string& name, int64_t b, int64_t h, int64_t t, int64_t dh,
                        bool causal, DType dt, Device d) {
  kernels::AttentionArgs a;
  a.b = b, a.h = h, a.tq = a.tk = t, a.d = dh;
  a.causal = causal ? kernels::Causal::yes : kernels::Causal::no;
  const Shape s{b, h, t, dh};
  auto q = std::make_shared<Operand>(operand(s, dt, d, 6));
  auto k = std::make_shared<Operand>(operand(s, dt, d, 7));
  auto v = std::make_shared<Operand>(operand(s, dt, d, 8));
  auto out = std::make_shared<Tensor>(output(s, dt, d));
  auto lse = std::make_shared<Tensor>(output(Shape{b, h, t}, DType::f32, d));
  auto ws = std::make_shared<Workspace>(kernels::attention_workspace_bytes(a, dt, d), d);
  Figure f;
  f.name = "attention/" + name;
  f.shape = fmt::format("B{} H{} T{} D{}{}", b, h, t, dh, causal ? " causal" : "");
  // Q K^T and P V: 4 b h t^2 d (half of it under a causal mask).
  f.flops = 4.0 * static_cast<double>(b * h) * static_cast<double>(t * t) *
            static_cast<double>(dh) * (causal ? 0.5 : 1.0);
  f.run = [=] { kernels::attention_forward(a, q->t, k->t, v->t, Tensor(), *out, *lse, ws->ws); };
  f.check = [=] {
    const std::vector<float> got = host_floats(*out);
    Check chk;
    uint32_t st = 13;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    for (int i = 0; i < 2; ++i) {
      const int64_t bh = pick(st, b * h), row = pick(st, t);
      const size_t base = static_cast<size_t>(bh * t * dh);
      const int64_t keys = causal ? row + 1 : t;
      std::vector<double> p(static_cast<size_t>(keys));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < dh; ++e)
          dot += static_cast<double>(q->host[base + static_cast<size_t>(row * dh + e)]) *
                 k->host[base + static_cast<size_t>(j * dh + e)];
        p[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int64_t e = 0; e < dh; ++e) {
        double want = 0, mag = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const double term =
              p[static_cast<size_t>(j)] / sum * v->host[base + static_cast<size_t>(j * dh + e)];
          want += term, mag += std::fabs(term);
        }
        chk.add(got[base + static_cast<size_t>(row * dh + e)], want, mag);
      }
    }
    return chk;
  };
  f.tolerance = dt == DType::f32 ? 1e-5 : 2e-2;
  return f;
}

Figure layernorm_figure(const std::string& name, int64_t rows, int64_t cols, DType dt, Device d) {
  kernels::LayerNormArgs a;
  a.rows = rows, a.cols = cols;
  auto x = std::make_shared<Operand>(operand(Shape{rows, cols}, dt, d, 9));
  auto gamma = std::make_shared<Operand>(operand(Shape{cols}, DType::f32, d, 10));
  auto beta = std::make_shared<Operand>(operand(Shape{cols}, DType::f32, d, 11));
  auto y = std::make_shared<Tensor>(output(Shape{rows, cols}, dt, d));
  auto mean = std::make_shared<Tensor>(output(Shape{rows}, DType::f32, d));
  auto rstd = std::make_shared<Tensor>(output(Shape{rows}, DType::f32, d));
  Figure f;
  f.name = "layernorm/" + name;
  f.shape = fmt::format("{} x {}", rows, cols);
  f.bytes = 2.0 * static_cast<double>(rows * cols) * static_cast<double>(dtype_size(dt));
  f.run = [=] { kernels::layer_norm_forward(a, x->t, gamma->t, beta->t, *y, *mean, *rstd); };
  f.check = [=] {
    const std::vector<float> got = host_floats(*y);
    Check chk;
    uint32_t st = 17;
    for (int i = 0; i < 4; ++i) {
      const int64_t r = pick(st, rows);
      double mu = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) mu += x->host[static_cast<size_t>(r * cols + c)];
      mu /= static_cast<double>(cols);
      for (int64_t c = 0; c < cols; ++c) {
        const double e = x->host[static_cast<size_t>(r * cols + c)] - mu;
        var += e * e;
      }
      const double rs = 1.0 / std::sqrt(var / static_cast<double>(cols) + a.eps);
      for (int64_t c = 0; c < cols; c += cols / 8) {
        const double xn = (x->host[static_cast<size_t>(r * cols + c)] - mu) * rs;
        const double want =
            xn * gamma->host[static_cast<size_t>(c)] + beta->host[static_cast<size_t>(c)];
        chk.add(got[static_cast<size_t>(r * cols + c)], want,
                std::fabs(xn * gamma->host[static_cast<size_t>(c)]) +
                    std::fabs(beta->host[static_cast<size_t>(c)]));
      }
    }
    return chk;
  };
  f.tolerance = dt == DType::f32 ? 1e-5 : 1e-2;
  return f;
}

// The figures, at the shapes of the built-in models' jobs (configs/*-synthetic.yaml's
// batches: ResNet-50 32 images, BERT-base 8 x 128 tokens, GPT-2 4 x 64, ViT-B/16 8
// images of 197 tokens).
std::vector<std::function<Figure()>> kernel_figures(DType dt, Device d) {
  return {
      [=] { return gemm_figure("bert-base.qkv", 1024, 2304, 768, dt, d); },
      [=] { return gemm_figure("bert-base.ffn-up", 1024, 3072, 768, dt, d); },
      [=] { return gemm_figure("bert-base.ffn-down", 1024, 768, 3072, dt, d); },
      [=] { return gemm_figure("vit-b16.qkv", 1576, 2304, 768, dt, d); },
      [=] { return gemm_figure("gpt2.lm-head", 256, 50257, 768, dt, d); },
      [=] { return conv_figure("resnet50.3x3-56", "fwd", 32, 64, 56, 64, 3, dt, d); },
      [=] { return conv_figure("resnet50.3x3-56", "bwd_data", 32, 64, 56, 64, 3, dt, d); },
      [=] { return conv_figure("resnet50.3x3-56", "bwd_filter", 32, 64, 56, 64, 3, dt, d); },
      [=] { return conv_figure("resnet50.1x1-56", "fwd", 32, 256, 56, 64, 1, dt, d); },
      [=] { return attention_figure("bert-base", 8, 12, 128, 64, false, dt, d); },
      [=] { return attention_figure("gpt2", 4, 12, 64, 64, true, dt, d); },
      [=] { return layernorm_figure("bert-base", 1024, 768, dt, d); },
  };
}

}  // namespace

Timing timing_of(const std::vector<double>& seconds) {
  Timing t;
  if (seconds.empty()) return t;
  t.runs = static_cast<int>(seconds.size());
  t.samples = seconds;
  t.median = quantile(seconds, 0.5);
  t.p10 = quantile(seconds, 0.1);
  t.p90 = quantile(seconds, 0.9);
  return t;
}

Timing time_samples(const std::function<double()>& sample, const BenchOptions& o) {
  std::vector<double> secs;
  double total = 0;
  Timing t;
  while (true) {
    const double s = sample();
    secs.push_back(s);
    total += s;
    t = timing_of(secs);
    const bool stable = t.runs >= 5 && total >= o.min_seconds && t.spread() <= 0.05;
    if (stable || total >= o.max_seconds || t.runs >= 50) break;
  }
  return t;
}

Timing time_repeated(const std::function<void()>& fn, const std::function<void()>& sync,
                     const BenchOptions& o) {
  fn();  // warm-up: first-touch pages, primitive creation, caches
  sync();
  return time_samples(
      [&] {
        const Clock::time_point t0 = Clock::now();
        fn();
        sync();
        return std::chrono::duration<double>(Clock::now() - t0).count();
      },
      o);
}

nlohmann::json bench_machine(const BenchOptions& o) {
  const kernels::CpuInfo cpu = kernels::query_cpu();
  const kernels::OneDnnInfo dnn = kernels::query_onednn();
  const dist::MpiInfo mpi = dist::query_mpi();
  const kernels::HostPeak peak =
      kernels::measure_host_peak(cpu.threads, 0.1, kernels::PeakPaths::all);
  nlohmann::json m = {{"cpu", cpu.model},
                      {"logical_cores", cpu.logical_cores},
                      {"threads", cpu.threads},
                      {"isa", cpu.isa},
                      {"fp32_peak_gflops", peak.fp32_flops / 1e9},
                      {"fp32_path", peak.fp32_path},
                      {"bf16_peak_gflops", peak.bf16_flops / 1e9},
                      {"bf16_path", peak.bf16_path},
                      {"memory_gbytes_per_s", peak.bytes_per_s / 1e9},
                      {"onednn", fmt::format("{}.{}.{}", dnn.major, dnn.minor, dnn.patch)},
                      {"mpi", mpi.built ? mpi.library : "none"},
                      {"device", o.device.str()}};
  const kernels::CudaInfo cuda = kernels::query_cuda();
  if (cuda.built) {
    m["cuda"] = {{"runtime", cuda.runtime_version}, {"driver", cuda.driver_version},
                 {"cudnn", cuda.cudnn_version},     {"nccl", cuda.nccl_version},
                 {"available", cuda.available},     {"reason", cuda.reason}};
  }
  if (o.device.is_cuda() && cuda.available &&
      o.device.index < static_cast<int>(cuda.devices.size())) {
    const std::string name = cuda.devices[static_cast<size_t>(o.device.index)].name;
    const kernels::GpuDatasheet sheet = kernels::gpu_datasheet(name);
    m["gpu"] = {{"name", name},
                {"datasheet", sheet.name},
                {"fp32_peak_gflops", sheet.fp32_flops / 1e9},
                {"bf16_peak_gflops", sheet.half_tensor_flops / 1e9},
                {"memory_gbytes_per_s", sheet.bytes_per_s / 1e9}};
  }
  return m;
}

double bench_peak_gflops(const nlohmann::json& machine, DType dt) {
  const nlohmann::json& peaks = machine.contains("gpu") ? machine["gpu"] : machine;
  const double bf16 = peaks.value("bf16_peak_gflops", 0.0);
  return dt == DType::bf16 && bf16 > 0 ? bf16 : peaks.value("fp32_peak_gflops", 0.0);
}

nlohmann::json bench_kernels(const BenchOptions& o, const nlohmann::json& machine,
                             const std::function<void(const std::string&)>& progress) {
  const nlohmann::json& peaks = machine.contains("gpu") ? machine["gpu"] : machine;
  nlohmann::json out = nlohmann::json::array();
  for (DType dt : o.dtypes) {
    const bool bf16_widened = dt == DType::bf16 && peaks.value("bf16_peak_gflops", 0.0) <= 0;
    const double peak = bench_peak_gflops(machine, dt);
    for (const auto& make : kernel_figures(dt, o.device)) {
      Figure f = make();
      if (!o.only.empty() && f.name.find(o.only) == std::string::npos) continue;
      const Timing t = time_repeated(
          f.run, [&] { kernels::synchronize(o.device); }, o);
      const Check c = f.check();
      nlohmann::json r = {{"suite", "kernels"},
                          {"name", f.name},
                          {"dtype", dname(dt)},
                          {"device", o.device.str()},
                          {"shape", f.shape},
                          {"runs", t.runs},
                          {"seconds_median", t.median},
                          {"seconds_p10", t.p10},
                          {"seconds_p90", t.p90},
                          {"spread", t.spread()},
                          {"check", c.json(f.tolerance)}};
      std::string rate;
      if (f.flops > 0) {
        r["gflop"] = f.flops / 1e9;
        r["gflops_per_s"] = f.flops / t.median / 1e9;
        if (peak > 0) r["peak_share"] = f.flops / t.median / 1e9 / peak;
        if (bf16_widened) r["peak"] = "fp32 (no bf16 path here)";
        rate = fmt::format("{:8.1f} GFLOP/s {:5.1f}% of peak", f.flops / t.median / 1e9,
                           100.0 * r.value("peak_share", 0.0));
      } else {
        const double bw = peaks.value("memory_gbytes_per_s", 0.0);
        r["gbytes"] = f.bytes / 1e9;
        r["gbytes_per_s"] = f.bytes / t.median / 1e9;
        if (bw > 0) r["bandwidth_share"] = f.bytes / t.median / 1e9 / bw;
        rate = fmt::format("{:8.1f} GB/s    {:5.1f}% of bandwidth", f.bytes / t.median / 1e9,
                           100.0 * r.value("bandwidth_share", 0.0));
      }
      progress(fmt::format("{:<34} {:<4} {:>9.3f} ms +-{:4.1f}%  {}  check {}", f.name, dname(dt),
                           t.median * 1e3, 100.0 * t.spread() / 2, rate,
                           c.worst <= f.tolerance ? "ok" : "FAILED"));
      out.push_back(std::move(r));
    }
  }
  return out;
}

BenchComparison compare_bench(const nlohmann::json& baseline, const nlohmann::json& now,
                              double threshold) {
  auto key = [](const nlohmann::json& r) {
    return fmt::format("{}/{} {} {}", r.value("suite", ""), r.value("name", ""),
                       r.value("dtype", ""), r.value("device", ""));
  };
  BenchComparison c;
  for (const nlohmann::json& b : baseline.at("results")) {
    const nlohmann::json* match = nullptr;
    for (const nlohmann::json& n : now.at("results"))
      if (key(n) == key(b)) match = &n;
    if (!match) {
      c.missing.push_back(key(b));
      continue;
    }
    BenchComparison::Row row;
    row.key = key(b);
    row.baseline = b.at("seconds_median").get<double>();
    row.now = match->at("seconds_median").get<double>();
    row.ratio = row.baseline > 0 ? row.now / row.baseline : 0;
    row.slower = row.ratio > 1.0 + threshold;
    c.any_slower = c.any_slower || row.slower;
    c.rows.push_back(row);
  }
  return c;
}

std::string format_comparison(const BenchComparison& c, double threshold) {
  std::string out =
      fmt::format("{:<48} {:>12} {:>12} {:>7}\n", "figure", "baseline ms", "now ms", "now/base");
  for (const BenchComparison::Row& r : c.rows) {
    out += fmt::format(
        "{:<48} {:>12.3f} {:>12.3f} {:>7.3f}{}\n", r.key, r.baseline * 1e3, r.now * 1e3, r.ratio,
        r.slower ? fmt::format("  slower by more than {:.0f}%", threshold * 100) : "");
  }
  for (const std::string& m : c.missing) out += fmt::format("{:<48} (not measured now)\n", m);
  return out;
}

}  // namespace dtrain::runtime
