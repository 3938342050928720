// bench_model: where one training step of a built-in model spends its time.
// Times every graph node's forward and backward through the executor's pre_op
// hook (an interval runs from one node's hook to the next, so it includes the
// executor's own work for that node: allocation, views, residual-gradient sums),
// the optimizer step, and each convolution's three oneDNN calls on their own.
// Prints JSON. Usage: bench_model [--arch resnet50] [--batch 32] [--image 224]
// [--classes 1000] [--channels 3] [--seq T] [--layers L --hidden C --heads H
// --ffn F --patch P, 0 or absent: the preset's] [--steps 3] [--warmup 2]
// [--device cpu|cuda[:N]] [--optimizer sgd|adamw] [--profile 0|1] [--dtype f32|bf16|f16]
// (bf16 / f16: the graph's DTypePolicy, with fp32 master weights as in training). Language models
// (bert-*, gpt2*) take their preset sizes, T tokens (--seq) and random ids; BERT predicts
// round(0.15 T) of them per sequence, as the masked-LM loader selects. On CUDA the step
// is timed between device synchronizations (forward, backward, optimizer each end with
// one), and the per-node profile (--profile 1, off by default there) synchronizes at every
// node, which slows the step it measures. SGD is momentum 0.9 (the ResNet peers'), AdamW
// weight decay 0.01 (the transformer peers'). "first_step" says what the first step
// costs beyond a steady one: its time, the fresh pages it faulted in (minor faults, from
// getrusage) against a steady step's, and this machine's cost of faulting fresh memory
// in (a 256 MiB mapping touched page by page on every thread), so the part of the
// first step's excess that first touches explain is printed beside the rest (oneDNN's
// primitive creation, weight reorders). Not a test; nothing is asserted.
#include <omp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "graph/executor.h"
#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "models/registry.h"
#include "optim/optimizer.h"
#include "runtime/master_weights.h"
#include "runtime/profiler.h"

namespace {

using namespace dtrain;
using Clock = std::chrono::steady_clock;
using graph::Phase;

struct Args {
  std::string arch = "resnet50";
  int64_t batch = 32, image = 224, classes = 1000, seq = 0;
  int64_t channels = 3, layers = 0, hidden = 0, heads = 0, ffn = 0, patch = 0;  // 0: the preset's
  int steps = 3, warmup = 2;
  Device device = Device::cpu();
  std::string optimizer = "sgd";
  int profile = -1;  // -1: on for the CPU, off for CUDA
  DType dtype = DType::f32;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--arch")
      a.arch = v;
    else if (k == "--dtype")
      a.dtype = parse_dtype(v);
    else if (k == "--batch")
      a.batch = std::atoll(v.c_str());
    else if (k == "--image")
      a.image = std::atoll(v.c_str());
    else if (k == "--classes")
      a.classes = std::atoll(v.c_str());
    else if (k == "--seq")
      a.seq = std::atoll(v.c_str());
    else if (k == "--channels")
      a.channels = std::atoll(v.c_str());
    else if (k == "--layers")
      a.layers = std::atoll(v.c_str());
    else if (k == "--hidden")
      a.hidden = std::atoll(v.c_str());
    else if (k == "--heads")
      a.heads = std::atoll(v.c_str());
    else if (k == "--ffn")
      a.ffn = std::atoll(v.c_str());
    else if (k == "--patch")
      a.patch = std::atoll(v.c_str());
    else if (k == "--steps")
      a.steps = std::atoi(v.c_str());
    else if (k == "--warmup")
      a.warmup = std::atoi(v.c_str());
    else if (k == "--device")
      a.device = Device::parse(v);
    else if (k == "--optimizer")
      a.optimizer = v;
    else if (k == "--profile")
      a.profile = std::atoi(v.c_str());
    else
      throw Error("bench_model: unknown option " + k, "see the usage line in bench_model.cpp");
  }
  if (a.optimizer != "sgd" && a.optimizer != "adamw")
    throw Error("bench_model: --optimizer " + a.optimizer, "use sgd or adamw");
  if (a.steps < 1) throw Error("bench_model: --steps must be at least 1");
  if (a.profile < 0) a.profile = a.device.is_cpu() ? 1 : 0;
  return a;
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Images uniform in [0, 1) or token ids uniform below the vocabulary, from a
// fixed LCG (the values only need to be ordinary, not random); labels by shape.
void fill_inputs(graph::Executor& ex, const models::ModelGraph& m, const ModelOptions& mo) {
  const graph::TensorSpec& in = m.graph.value(m.input).spec;
  const graph::TensorSpec& lab = m.graph.value(m.labels).spec;
  Tensor x = Tensor::empty(in.shape, in.dtype), y = Tensor::empty(lab.shape, DType::i32);
  Allocator& alloc = kernels::device_allocator(ex.device());
  uint32_t state = 12345;
  auto next = [&state] { return (state = state * 1664525u + 1013904223u) >> 8; };
  const uint32_t vocab = static_cast<uint32_t>(mo.vocab_size.value_or(1000));
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (in.dtype == DType::i32) {
      x.data<int32_t>()[i] = static_cast<int32_t>(next() % vocab);
    } else {
      x.data<float>()[i] = static_cast<float>(next()) / 16777216.0f;
    }
  }
  const bool masked = find_arch(mo.arch)->family == ModelFamily::bert && lab.shape.rank() == 2;
  const uint32_t classes = static_cast<uint32_t>(mo.num_classes.value_or(static_cast<int>(vocab)));
  for (int64_t i = 0; i < y.numel(); ++i)
    y.data<int32_t>()[i] = static_cast<int32_t>(next() % classes);
  if (masked) {  // the loader's masking: exactly M labelled positions per sequence, the rest -100
    const int64_t t = lab.shape[1];
    const int64_t mpred = mo.mlm_predictions.value_or(masked_lm_predictions(t, 0.15));
    for (int64_t r = 0; r < lab.shape[0]; ++r) {
      int32_t* row = y.data<int32_t>() + r * t;
      for (int64_t j = 0; j < t; ++j)
        if (j % (t / mpred) != 0 || j / (t / mpred) >= mpred) row[j] = -100;
    }
  }
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), &alloc);
  Tensor dy = Tensor::empty(y.shape(), y.dtype(), &alloc);
  kernels::copy(x, dx);
  kernels::copy(y, dy);
  ex.set_input(m.input, dx);
  ex.set_input(m.labels, dy);
}

struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0;
  std::vector<double> steps;  // each measured step, forward to the optimizer's end
  double first = 0;           // the first step (warm-up or not)
  std::vector<long> faults;   // minor page faults of every step, the first included
};

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Seconds per byte of fresh anonymous memory faulted in, every thread touching its
// share of a 256 MiB mapping one byte per page (what a first step's new blocks cost).
double first_touch_seconds_per_byte() {
  const size_t bytes = size_t{256} << 20, page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  char* c = static_cast<char*>(p);
  const auto t0 = Clock::now();
  const auto pages = static_cast<int64_t>(bytes / page);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; ++i) c[static_cast<size_t>(i) * page] = 1;
  const double s = since(t0);
  munmap(p, bytes);
  return s / static_cast<double>(bytes);
}

StepTimes run_steps(graph::Executor& ex, const models::ModelGraph& m, runtime::Profiler* timer,
                    const Args& a) {
  OptimizerOptions o;
  if (a.optimizer == "adamw") {
    o.name = OptimizerName::adamw;
    o.weight_decay = 0.01;
  } else {
    o.name = OptimizerName::sgd;
    o.momentum = 0.9;
    o.weight_decay = 0.0;
  }
  const Device d = ex.device();
  // Half graphs step fp32 masters as training does (runtime::MasterWeights): one fused
  // pass per segment reads the executor's f32 gradients, updates the master and writes
  // the half copy.
  runtime::MasterWeights weights(
      ex, a.dtype == DType::f32 ? runtime::MasterMode::fp32 : runtime::MasterMode::masters, 1, d);
  const Tensor grads = weights.grads();
  std::vector<optim::ParamSegment> segs;
  for (const graph::FlatEntry& e : weights.layout()) {
    optim::ParamSegment seg;
    seg.name = e.name;
    seg.offset = e.offset;
    seg.size = e.spec.shape.numel();
    segs.push_back(seg);
  }
  auto opt = optim::make_optimizer(o, segs, grads.numel(), d);
  StepTimes t;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    const bool rec = s >= a.warmup;
    if (timer && s == a.warmup) timer->attach(ex);  // the measured steps' ops only
    const long faults0 = minor_faults();
    auto t0 = Clock::now();
    ex.forward(graph::Mode::train, static_cast<uint64_t>(s));
    kernels::synchronize(d);
    const double f = since(t0);
    t0 = Clock::now();
    ex.backward(m.loss);
    kernels::synchronize(d);
    const double b = since(t0);
    t0 = Clock::now();
    opt->step(weights.target(), grads, 1e-4);
    kernels::synchronize(d);
    const double u = since(t0);
    t.faults.push_back(minor_faults() - faults0);
    if (s == 0) t.first = f + b + u;
    if (rec) {
      t.forward += f, t.backward += b, t.optimizer += u;
      t.steps.push_back(f + b + u);
    }
  }
  t.forward /= a.steps, t.backward /= a.steps, t.optimizer /= a.steps;
  return t;
}

// A conv node's geometry from its shapes: weight [K, C/g, R, R], pad R/2 (every
// ResNet conv), stride from the spatial ratio. False when that does not fit.
bool conv_args(const graph::Graph& g, const graph::Node& n, const graph::FlatStore& params,
               kernels::Conv2dArgs& a) {
  const Shape& x = g.value(n.inputs[0]).spec.shape;
  const Shape& y = g.value(n.outputs[0]).spec.shape;
  const Shape& w = params.view(n.params[0]).shape();
  const int64_t stride = std::max<int64_t>(1, x[2] / y[2]);
  a = {x[0], x[1], x[2], x[3], w[0], w[2], w[3], stride, stride, w[2] / 2, w[3] / 2, 1, 1, 1};
  return w[1] == x[1] && a.out_h() == y[2] && a.out_w() == y[3];
}

Tensor zeros(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  kernels::fill(t, 0.0f);
  return t;
}

// Best of two calls of fn, in seconds.
template <typename Fn>
double best_of_two(Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < 2; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, since(t0));
  }
  return best;
}

// Every conv's fwd / bwd-data / bwd-filter alone, summed over the model's convs, with
// activations in this CPU's channel block where the channels allow (as the executor
// keeps them: graph/layouts.h), so no activation is reordered.
nlohmann::json isolated_convs(const graph::Graph& g, const graph::FlatStore& params) {
  double fwd = 0, bwd_data = 0, bwd_filter = 0, flops = 0;
  int convs = 0, skipped = 0;
  for (const graph::Node& n : g.nodes()) {
    kernels::Conv2dArgs a;
    if (n.op->kind() != "conv2d") continue;
    if (!conv_args(g, n, params, a)) {
      ++skipped;
      continue;
    }
    const int64_t b = kernels::cpu_channel_block();
    if (b > 0 && a.groups == 1) {
      a.x_block = a.c % b == 0 ? b : 0;
      a.y_block = a.k % b == 0 ? b : 0;
    }
    // Zeros: the kernels' speed does not depend on the values.
    Tensor x = zeros({a.n, a.c, a.h, a.w}), dx = zeros({a.n, a.c, a.h, a.w});
    Tensor w = zeros({a.k, a.c, a.r, a.s}), dw = zeros({a.k, a.c, a.r, a.s});
    Tensor y = zeros({a.n, a.k, a.out_h(), a.out_w()}),
           dy = zeros({a.n, a.k, a.out_h(), a.out_w()});
    Tensor wsb = Tensor::empty(
        {static_cast<int64_t>(kernels::conv2d_workspace_bytes(a, DType::f32))}, DType::u8);
    const kernels::Workspace ws{wsb.raw(), wsb.nbytes()};
    fwd += best_of_two([&] { kernels::conv2d_forward(a, x, w, y, ws); });
    bwd_data += best_of_two([&] { kernels::conv2d_backward_data(a, dy, w, dx, ws); });
    bwd_filter += best_of_two([&] { kernels::conv2d_backward_filter(a, x, dy, dw, ws); });
    flops += a.flops();
    ++convs;
  }
  return {{"convs", convs},
          {"skipped", skipped},
          {"fwd_s", fwd},
          {"bwd_data_s", bwd_data},
          {"bwd_filter_s", bwd_filter},
          {"fwd_gflops", flops / 1e9},
          {"fwd_gflop_per_s", flops / fwd / 1e9},
          {"bwd_gflop_per_s", 2 * flops / (bwd_data + bwd_filter) / 1e9}};
}

nlohmann::json by_kind(const graph::Graph& g, const runtime::Profiler& t, int steps,
                       double step_s) {
  std::map<std::string, std::pair<double, double>> kinds;  // kind -> (fwd, bwd) per step
  std::vector<std::pair<double, std::string>> nodes;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    auto& k = kinds[std::string(g.nodes()[i].op->kind())];
    k.first += t.forward_seconds()[i] / steps;
    k.second += t.backward_seconds()[i] / steps;
    nodes.push_back(
        {(t.forward_seconds()[i] + t.backward_seconds()[i]) / steps, g.nodes()[i].name});
  }
  nlohmann::json out = nlohmann::json::object(), top = nlohmann::json::array();
  for (const auto& [kind, fb] : kinds) {
    out[kind] = {{"fwd_s", fb.first},
                 {"bwd_s", fb.second},
                 {"share_of_step", (fb.first + fb.second) / step_s}};
  }
  std::sort(nodes.rbegin(), nodes.rend());
  for (size_t i = 0; i < std::min<size_t>(10, nodes.size()); ++i)
    top.push_back({{"node", nodes[i].second}, {"fwd_plus_bwd_s", nodes[i].first}});
  return {{"by_kind", out}, {"slowest_nodes", top}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const ArchPreset* arch = find_arch(a.arch);
    if (!arch) throw Error("bench_model: unknown --arch " + a.arch, "see models/options.h");
    ModelOptions mo = preset_options(*arch);
    if (!is_language_model(arch->family)) {
      mo.num_classes = static_cast<int>(a.classes);
      mo.image_size = static_cast<int>(a.image);
      mo.in_channels = static_cast<int>(a.channels);
      if (a.patch > 0) mo.patch_size = static_cast<int>(a.patch);
    } else if (a.seq > 0) {
      mo.seq_len = static_cast<int>(a.seq);
    }
    if (a.layers > 0) mo.layers = static_cast<int>(a.layers);
    if (a.hidden > 0) mo.hidden = static_cast<int>(a.hidden);
    if (a.heads > 0) mo.heads = static_cast<int>(a.heads);
    if (a.ffn > 0) mo.ffn = static_cast<int>(a.ffn);
    const models::ModelGraph m = models::build_model(mo, a.batch, graph::DTypePolicy{a.dtype});
    graph::Executor ex(m.graph, a.device);
    ex.initialize(42);
    fill_inputs(ex, m, mo);
    // The trainer's profiler (runtime/profiler.h), timing only: one code path for the
    // trace of logging.profile and this table.
    runtime::Profiler timer(m.graph, ex.device(), 0);
    timer.set_tracing(false);
    // Measured before the steps, while the process holds little (after ResNet-50's
    // steps the same mapping faulted in at 1.0 GB/s here, against 3.1 before them).
    const double touch_per_byte = a.device.is_cpu() ? first_touch_seconds_per_byte() : 0.0;
    StepTimes st = run_steps(ex, m, a.profile ? &timer : nullptr, a);
    const double step = st.forward + st.backward + st.optimizer;
    std::sort(st.steps.begin(), st.steps.end());
    const double median = st.steps[st.steps.size() / 2];
    const double samples = static_cast<double>(a.batch);
    nlohmann::json out = {{"arch", a.arch},
                          {"device", a.device.str()},
                          {"optimizer", a.optimizer},
                          {"dtype", dtype_name(a.dtype)},
                          {"median_step_s", median},
                          {"samples_per_s", samples / median},
                          {"batch", a.batch},
                          {"image", a.image},
                          {"seq", mo.seq_len.value_or(0)},
                          {"threads", omp_get_max_threads()},
                          {"steps", a.steps},
                          {"params", m.graph.num_params()},
                          {"forward_gflops", m.graph.forward_flops() / 1e9},
                          {"step_s", step},
                          {"forward_s", st.forward},
                          {"backward_s", st.backward},
                          {"optimizer_s", st.optimizer}};
    if (is_language_model(arch->family))
      out["tokens_per_s"] = samples * static_cast<double>(mo.seq_len.value_or(0)) / median;
    if (a.device.is_cuda())
      out["peak_device_bytes"] = kernels::device_allocator(a.device).stats().peak;
    if (a.device.is_cpu()) {  // what the first step costs beyond a steady one
      std::vector<long> later(st.faults.begin() + 1, st.faults.end());
      std::sort(later.begin(), later.end());
      const long steady = later.empty() ? 0 : later[later.size() / 2];
      const auto page = static_cast<double>(sysconf(_SC_PAGESIZE));
      const double fresh = static_cast<double>(st.faults[0] - steady) * page;
      const double per_byte = touch_per_byte;
      out["first_step"] = {{"seconds", st.first},
                           {"over_median", st.first / median},
                           {"minor_faults", st.faults[0]},
                           {"steady_minor_faults", steady},
                           {"fresh_bytes", fresh},
                           {"first_touch_gb_per_s", per_byte > 0 ? 1e-9 / per_byte : 0.0},
                           {"first_touch_s", fresh * per_byte},
                           {"rest_s", st.first - median - fresh * per_byte}};
    }
    if (a.profile) out["nodes"] = by_kind(m.graph, timer, a.steps, step);
    if (a.device.is_cpu() && a.dtype == DType::f32)
      out["isolated_convs"] = isolated_convs(m.graph, ex.params());
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 1;
  }
}
