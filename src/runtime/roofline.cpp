// See roofline.h. A node's bytes are what its kernels must move at least once: its input
// and output values and its parameters (TensorSpecs), never the workspace or the
// re-reads a cache would absorb. Matrix ops (GEMM, convolution, attention) run at the
// matrix peak of their operands' dtype, everything else at the vector peak. Offloaded,
// the optimizer's step is a pass over its bytes at the host's bandwidth, and its
// transfers take the link's bandwidth one after the other (MasterWeights::step).
#include "runtime/roofline.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "core/error.h"
#include "graph/lifetimes.h"
#include "kernels/device_info.h"
#include "kernels/peak.h"
#include "optim/optimizer.h"
#include "precision/options.h"
#include "runtime/estimate.h"
#include "runtime/param_groups.h"
#include "runtime/zero.h"

namespace dtrain::runtime {
namespace {

double spec_bytes(const graph::TensorSpec& s) {
  return static_cast<double>(s.shape.numel()) * static_cast<double>(dtype_size(s.dtype));
}

bool is_matrix_op(std::string_view kind) {
  constexpr std::array<std::string_view, 4> kMatrix = {"linear", "linear_gelu", "conv2d",
                                                       "self_attention"};
  return std::find(kMatrix.begin(), kMatrix.end(), kind) != kMatrix.end();
}

struct NodeCost {
  double flops = 0, bytes = 0, flops_per_s = 0;
};

NodeCost node_cost(const graph::Graph& g, const graph::Node& n, const RooflinePeak& peak) {
  NodeCost c;
  const NodeWork w = node_work(g, n);
  c.flops = w.flops;
  c.bytes = w.bytes;
  // The output's dtype is the operands' (the graph's compute dtype for matrix ops).
  const bool half = !n.info.outputs.empty() && is_floating(n.info.outputs[0].dtype) &&
                    n.info.outputs[0].dtype != DType::f32;
  c.flops_per_s = !is_matrix_op(n.op->kind()) ? peak.vector_flops
                  : half                      ? peak.matrix_half_flops
                                              : peak.matrix_f32_flops;
  return c;
}

}  // namespace

NodeWork node_work(const graph::Graph& g, const graph::Node& n) {
  NodeWork w;
  w.flops = n.info.flops;
  for (graph::ValueId v : n.inputs) w.bytes += spec_bytes(g.value(v).spec);
  for (graph::ValueId v : n.outputs) w.bytes += spec_bytes(g.value(v).spec);
  for (int p : n.params) {
    const graph::ParamSpec& s = g.param_layout()[static_cast<size_t>(p)].spec;
    w.bytes += static_cast<double>(s.shape.numel()) * static_cast<double>(dtype_size(s.dtype));
  }
  return w;
}

double backward_passes(const graph::Graph& g, const graph::BackwardSet& frozen, int node) {
  if (!frozen.runs(node)) return 0.0;
  const graph::Node& n = g.nodes()[static_cast<size_t>(node)];
  if (n.params.empty()) return 2.0;
  // The weight-gradient pass is the first parameter's (a linear's or convolution's
  // weight, an embedding's word table); a bias's sum alone counts for nothing.
  const bool weight = !frozen.skips_grad(n, 0);
  bool input_could = false, input = false;
  for (graph::ValueId v : n.inputs) {
    if (!g.value(v).requires_grad) continue;
    input_could = true;
    input = input || frozen.wants(v);
  }
  return 2.0 - (weight ? 0.0 : 1.0) - (input_could && !input ? 1.0 : 0.0);
}

double train_flops(const graph::Graph& g, const graph::BackwardSet& frozen, int micro_batches) {
  double flops = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    flops += (1.0 + backward_passes(g, frozen, static_cast<int>(i))) * g.nodes()[i].info.flops;
  return flops * micro_batches;
}

graph::BackwardSet job_backward_set(const Job& job, const graph::Graph& g) {
  const bool zero3 = job.parallel.zero_stage >= 3 && job.parallel.data > 1;
  return graph::backward_set(g, ParamGroups(job.optimizer, g, job.model.arch).frozen_mask(),
                             !zero3 && job.parallel.pipeline == 1);
}

namespace {

// What bounds a pass over `flops` and `bytes`: adds its time to `e` and returns it.
double add_pass(StepTimeEstimate& e, double flops, double bytes, double flops_per_s,
                double bytes_per_s) {
  const double compute = flops / flops_per_s, memory = bytes / bytes_per_s;
  (compute >= memory ? e.compute_bound_seconds : e.memory_bound_seconds) +=
      std::max(compute, memory);
  e.flops += flops;
  e.bytes += bytes;
  return std::max(compute, memory);
}

std::string giga(double v) { return fmt::format("{:.0f}", v / 1e9); }

RooflinePeak cpu_peak(DType compute) {
  const kernels::HostPeak& h = kernels::measured_host_peak();
  if (h.fp32_flops <= 0) {
    throw RunError(
        "this CPU has neither AVX-512 nor AVX2 + FMA, the paths whose peak dtrain measures");
  }
  RooflinePeak p;
  p.matrix_f32_flops = p.vector_flops = h.fp32_flops;
  p.bytes_per_s = h.bytes_per_s;
  std::string half;
  // f16 GEMMs and convolutions are widened to f32 on the CPU (kernels/cpu/dense_dnnl.h);
  // bf16 ones run natively (AMX or avx512_bf16) when the CPU has either.
  if (compute == DType::bf16 && h.bf16_flops > 0) {
    p.matrix_half_flops = h.bf16_flops;
    half = fmt::format(", bf16 {} GFLOP/s ({})", giga(h.bf16_flops), h.bf16_path);
  } else {
    p.matrix_half_flops = h.fp32_flops;
    if (compute != DType::f32)
      half = fmt::format(", {} GEMMs at the fp32 peak", dtype_name(compute));
  }
  p.source =
      fmt::format("measured on this host, {} threads: fp32 {} GFLOP/s ({}){}, triad {:.1f} GB/s",
                  h.threads, giga(h.fp32_flops), h.fp32_path, half, h.bytes_per_s / 1e9);
  return p;
}

RooflinePeak cuda_peak(Device device, kernels::MathMode math, bool offload) {
  const kernels::CudaInfo cuda = kernels::query_cuda();
  std::string name;
  for (const kernels::CudaDeviceInfo& d : cuda.devices)
    if (d.index == device.index) name = d.name;
  bool matched = false;
  const kernels::GpuDatasheet s = kernels::gpu_datasheet(name, &matched);
  RooflinePeak p;
  p.matrix_half_flops = s.half_tensor_flops;
  const bool tf32 = math == kernels::MathMode::tf32;
  p.matrix_f32_flops = tf32 ? s.tf32_tensor_flops : s.fp32_flops;
  p.vector_flops = s.fp32_flops;
  p.bytes_per_s = s.bytes_per_s;
  const std::string why =
      matched        ? std::string()
      : name.empty() ? fmt::format(" (no {} here: the stated reference)", device.str())
                     : fmt::format(" ({} is not in the table: the stated reference)", name);
  p.source = fmt::format(
      "{} datasheet{}: bf16/fp16 tensor {:.0f} TFLOP/s, f32 GEMM {:.1f} TFLOP/s ({}), "
      "HBM {:.2f} TB/s",
      s.name, why, s.half_tensor_flops / 1e12, p.matrix_f32_flops / 1e12, tf32 ? "tf32" : "fp32",
      s.bytes_per_s / 1e12);
  if (offload) {
    const kernels::HostPeak& h = kernels::measured_host_peak();
    if (h.bytes_per_s <= 0)
      throw RunError("the host's memory bandwidth (the offloaded optimizer's) measured as 0");
    p.host_bytes_per_s = h.bytes_per_s;
    p.link_bytes_per_s = s.host_link_bytes_per_s;
    p.source += fmt::format(
        "; offload: PCIe {:.0f} GB/s per direction ({} datasheet), host triad {:.1f} GB/s "
        "(measured on this host)",
        s.host_link_bytes_per_s / 1e9, s.name, h.bytes_per_s / 1e9);
  }
  return p;
}

double param_bytes(const graph::Graph& g) {
  double bytes = 0;
  for (const auto& p : g.param_layout())
    bytes +=
        static_cast<double>(p.spec.shape.numel()) * static_cast<double>(dtype_size(p.spec.dtype));
  return bytes;
}

}  // namespace

RooflinePeak roofline_peak(Device device, DType compute, kernels::MathMode math, bool offload) {
  return device.is_cuda() ? cuda_peak(device, math, offload) : cpu_peak(compute);
}

StepTimeEstimate roofline_step_time(const graph::Graph& g, const RooflinePeak& peak,
                                    int micro_batches, int blocks_per_segment,
                                    size_t optimizer_bytes, size_t host_bytes, size_t link_bytes,
                                    const graph::BackwardSet* frozen) {
  DTRAIN_CHECK(peak.matrix_f32_flops > 0 && peak.matrix_half_flops > 0 && peak.vector_flops > 0 &&
                   peak.bytes_per_s > 0,
               "roofline peak without a figure: {}", peak.source);
  DTRAIN_CHECK(micro_batches >= 1, "micro_batches {}", micro_batches);
  StepTimeEstimate e;
  e.source = peak.source;
  // The same segments the executor recomputes (graph/lifetimes.h).
  const graph::BackwardSet none;
  const graph::BackwardSet& set = frozen != nullptr ? *frozen : none;
  std::vector<char> recomputed(g.nodes().size(), 0);
  if (blocks_per_segment > 0) {
    const graph::Lifetimes life =
        graph::plan_lifetimes(g, graph::Mode::train, {}, blocks_per_segment, {}, &set);
    for (size_t s = 0; s < life.segments.size(); ++s)
      for (int i = life.segments[s].first; i <= life.segments[s].last && life.recomputed[s]; ++i)
        recomputed[static_cast<size_t>(i)] = 1;
  }
  const double mb = micro_batches;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const NodeCost c = node_cost(g, g.nodes()[i], peak);
    // Forward once, backward at twice forward's FLOPs and bytes (the input and the
    // weight gradient each cost a forward; less what set_frozen skips), the recompute
    // once more.
    const double passes =
        1.0 + backward_passes(g, set, static_cast<int>(i)) + (recomputed[i] ? 1.0 : 0.0);
    const double t =
        add_pass(e, passes * mb * c.flops, passes * mb * c.bytes, c.flops_per_s, peak.bytes_per_s);
    if (recomputed[i]) e.recompute_seconds += t / passes;
  }
  e.optimizer_seconds =
      add_pass(e, 0.0, static_cast<double>(optimizer_bytes), peak.vector_flops, peak.bytes_per_s);
  if (host_bytes > 0) {
    DTRAIN_CHECK(peak.host_bytes_per_s > 0, "offloaded step without the host's bandwidth: {}",
                 peak.source);
    e.optimizer_seconds +=
        add_pass(e, 0.0, static_cast<double>(host_bytes), peak.vector_flops, peak.host_bytes_per_s);
  }
  if (link_bytes > 0) {
    DTRAIN_CHECK(peak.link_bytes_per_s > 0, "offloaded step without the link's bandwidth: {}",
                 peak.source);
    e.offload_seconds = static_cast<double>(link_bytes) / peak.link_bytes_per_s;
  }
  e.seconds = e.compute_bound_seconds + e.memory_bound_seconds + e.offload_seconds;
  return e;
}

OptimizerTraffic optimizer_traffic(const Job& job, const graph::Graph& g) {
  const DType compute = compute_dtype(job.precision.dtype);
  const bool half = compute != DType::f32;
  // In f32 words per parameter. Around the step, where the gradients are: the gradient
  // zeroed for the next step, the global norm's read (clipping), the accumulation.
  double around = 1.0;
  const OptimizerOptions& o = job.optimizer;
  if (o.clip_grad_norm) around += 1.0;
  if (job.parallel.micro_batches > 1) around += 3.0 * job.parallel.micro_batches;
  // The step itself: the gradient read, the weights, the state, LAMB's norms.
  double step = 1.0;
  if (!half)
    step += 2.0;  // f32 weights read and written
  else if (job.precision.master_weights)
    step += 2.0 + 0.5;  // the fp32 masters read and written, the half weights written
  else
    step += 1.0;  // half weights read and written in place
  step += 2.0 * (optim::state_buffer_count(o) - (o.ema.decay ? 1 : 0));  // read and written
  if (o.name == OptimizerName::lamb) step += 2.0;  // the weight and update norms
  // optimizer.freeze: the step and the gradients' passes cover the trained parameters
  // only (a frozen one is passed over; its gradient is zeros no bucket sends); the
  // EMA's pass reads the weights and reads and writes the average of every one.
  const double n = static_cast<double>(g.num_params());
  double trained = n;
  if (!job.optimizer.freeze.empty()) {
    const ParamGroups groups(job.optimizer, g, job.model.arch);
    const std::vector<uint8_t>& frozen = groups.frozen_mask();
    for (size_t p = 0; p < frozen.size(); ++p)
      if (frozen[p] != 0) trained -= static_cast<double>(g.param_layout()[p].spec.shape.numel());
  }
  const double ema = o.ema.decay ? 3.0 * n : 0.0;
  // ZeRO-1: this rank steps its shard (the last rank's, the largest) of the layout.
  double share = 1.0;
  if (job.parallel.zero_stage >= 1 && job.parallel.data > 1 && g.num_params() > 0) {
    const ShardRange last = shard_of(g.num_params(), job.parallel.data - 1, job.parallel.data);
    share = static_cast<double>(last.size()) / n;
  }
  OptimizerTraffic t;
  if (!job.memory.offload.optimizer || !job.device.is_cuda()) {  // offload: CUDA only
    t.device_bytes = static_cast<size_t>((around * trained + share * (step * trained + ema)) * 4.0);
    return t;
  }
  t.device_bytes = static_cast<size_t>(around * 4.0 * trained);
  t.host_bytes = static_cast<size_t>(share * (step * trained + ema) * 4.0);
  t.link_bytes = static_cast<size_t>(4.0 * n + param_bytes(g));  // gradients down, weights up
  return t;
}

size_t optimizer_step_bytes(const Job& job, const graph::Graph& g) {
  const OptimizerTraffic t = optimizer_traffic(job, g);
  return t.device_bytes + t.host_bytes;
}

StepTimeEstimate estimate_step_time(const Job& job, const graph::Graph& g,
                                    const graph::BackwardSet* frozen) {
  const kernels::MathMode math =
      job.precision.tf32 ? kernels::MathMode::tf32 : kernels::MathMode::fp32;
  const bool offload = job.memory.offload.optimizer && job.device.is_cuda();
  const RooflinePeak peak =
      roofline_peak(job.device, compute_dtype(job.precision.dtype), math, offload);
  const OptimizerTraffic t = optimizer_traffic(job, g);
  const graph::BackwardSet own =
      frozen != nullptr ? graph::BackwardSet() : job_backward_set(job, g);
  return roofline_step_time(g, peak, job.parallel.micro_batches, blocks_per_segment(job, g),
                            t.device_bytes, t.host_bytes, t.link_bytes,
                            frozen != nullptr ? frozen : &own);
}

}  // namespace dtrain::runtime
