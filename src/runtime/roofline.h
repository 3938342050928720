// A roofline step time for `dtrain estimate`: per graph node, the longer of its FLOPs at
// the device's peak and its bytes at the device's bandwidth, summed over forward,
// backward (2x forward's FLOPs and bytes), checkpointing's recompute and the optimizer
// pass; with memory.offload.optimizer (CUDA) the optimizer's pass runs at the host's
// bandwidth instead and the gradients and parameters cross the host link. A lower
// bound: it assumes every kernel reaches the peak, and counts no launch, framework or
// communication time. The peaks are the host's measured ones (kernels/peak.h) or, for
// CUDA, a GPU datasheet's; the estimate never times the job.
#pragma once

#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "graph/graph.h"
#include "graph/lifetimes.h"
#include "kernels/common.h"
#include "runtime/job.h"

namespace dtrain::runtime {

struct RooflinePeak {
  double matrix_f32_flops = 0;   // GEMM, convolution, attention on f32 operands
  double matrix_half_flops = 0;  // the same on bf16 / f16 operands
  double vector_flops = 0;       // every other op (element-wise, norms, softmax, loss)
  double bytes_per_s = 0;
  std::string source;  // "measured on this host, ..." or "H200 SXM datasheet ..."
  // Offload only: the host's memory bandwidth (measured) and the host link's per
  // direction (the datasheet's PCIe figure); 0 when not asked for.
  double host_bytes_per_s = 0;
  double link_bytes_per_s = 0;
};

// A node's forward FLOPs (its op's count for the whole batch) and the bytes its kernels
// move at least once: inputs, outputs and parameters. Backward counts twice both.
struct NodeWork {
  double flops = 0, bytes = 0;
};
NodeWork node_work(const graph::Graph& g, const graph::Node& n);

// A node's backward in forward passes: 2 (its input's gradient and its parameters'),
// less what optimizer.freeze skips (graph::BackwardSet, as Executor::set_frozen applies
// it): none for a node that runs no backward; one less for a node whose first parameter
// (the weight: its bias's sum is not counted) is frozen and skipped
// (Op::skips_param_grad), one less for a node with parameters whose inputs would take a
// gradient but none is wanted. Nothing frozen: 2 for every node, also the first layer,
// whose input (the batch) takes no gradient.
double backward_passes(const graph::Graph& g, const graph::BackwardSet& frozen, int node);
// The FLOPs of one training step on a rank: each node's forward once and backward
// backward_passes times, every micro-batch (3x forward with nothing frozen). What
// `dtrain estimate` prints and the trainer's model_gflops_per_s counts.
double train_flops(const graph::Graph& g, const graph::BackwardSet& frozen, int micro_batches);
// The job's frozen set (runtime::ParamGroups) as the trainer's executor applies it:
// pruned where it runs the whole graph on parameters it owns (not ZeRO-3 on several
// ranks, not a pipeline stage).
graph::BackwardSet job_backward_set(const Job& job, const graph::Graph& g);

// The peaks a job on `device` with compute dtype `compute` runs against. CPU: measured
// once per process (about half a second). CUDA: the datasheet of the GPU query_cuda()
// finds at device.index, else the H200's as a stated reference. `math`: tf32
// (precision.tf32) moves f32 GEMMs onto a GPU's tensor cores. Throws RunError when the
// host has no measurable fp32 path (neither AVX-512 nor AVX2 + FMA). `offload` (CUDA):
// also the host's measured bandwidth (the half second above) and the PCIe figure.
RooflinePeak roofline_peak(Device device, DType compute,
                           kernels::MathMode math = kernels::MathMode::fp32, bool offload = false);

struct StepTimeEstimate {
  double seconds = 0;                // the roofline step time, per rank
  double compute_bound_seconds = 0;  // the part spent in nodes their FLOPs bound...
  double memory_bound_seconds = 0;   // ...and in those (and the optimizer) their bytes bound
  double recompute_seconds = 0;      // of `seconds`: checkpointing's second forward
  double optimizer_seconds = 0;      // of `seconds`: the optimizer's pass over its buffers
                                     // (offloaded: the device's share plus the host step)
  double offload_seconds = 0;        // of `seconds`, not in the two bounds: the PCIe transfers
  double flops = 0;                  // counted: forward, backward, recompute, every micro-batch
  double bytes = 0;                  // counted, the optimizer's (device and host) included
  std::string source;                // the peak's
};

// What one optimizer step moves, where. On the device (or the host of a CPU job): the
// gradient zeroed, the accumulation, and without offload the whole step. Offloaded:
// the host step's reads and writes, and the bytes over the link (the f32 gradients
// down, the parameters in their own dtypes up).
struct OptimizerTraffic {
  size_t device_bytes = 0;
  size_t host_bytes = 0;
  size_t link_bytes = 0;
};

// `g` built for one micro-batch; `blocks_per_segment` as Executor::set_checkpointing
// (0: none): the nodes of checkpointed segments run forward twice. `optimizer_bytes`:
// what one optimizer step reads and writes on the device (parameters, gradients,
// masters, state). Offloaded, `host_bytes` at peak.host_bytes_per_s and `link_bytes` at
// peak.link_bytes_per_s (one direction at a time: MasterWeights::step downloads, steps,
// then uploads). `frozen`: backward's passes per node (backward_passes; null: 2 each),
// and a checkpointed segment where no node runs backward is not recomputed.
StepTimeEstimate roofline_step_time(const graph::Graph& g, const RooflinePeak& peak,
                                    int micro_batches, int blocks_per_segment = 0,
                                    size_t optimizer_bytes = 0, size_t host_bytes = 0,
                                    size_t link_bytes = 0,
                                    const graph::BackwardSet* frozen = nullptr);

// What one optimizer step of `job` reads and writes in all, from the f32 layout of `g`'s
// parameters: the gradient (read, and zeroed for the next step), the weights (f32, or
// the fp32 masters plus the half copy written back), each state tensor read and written,
// a clipping pass, LAMB's norm pass, and the accumulation buffer's read-modify-write per
// micro-batch when there are several. ZeRO-1 (parallel.zero_stage >= 1 on several
// ranks): the step's reads and writes of the weights, masters and state cover this
// rank's share of the layout; the gathers are communication, not counted.
size_t optimizer_step_bytes(const Job& job, const graph::Graph& g);

// optimizer_step_bytes split by where it runs (memory.offload.optimizer), plus the link.
OptimizerTraffic optimizer_traffic(const Job& job, const graph::Graph& g);

// The job's roofline: its device's peak (roofline_peak), its micro-batches and
// checkpointing, optimizer.freeze (job_backward_set), and optimizer_traffic. `g`: the job's graph
// for one micro-batch. Throws RunError where roofline_peak does.
// `frozen`: the job's frozen set when the caller has it (null: job_backward_set).
StepTimeEstimate estimate_step_time(const Job& job, const graph::Graph& g,
                                    const graph::BackwardSet* frozen = nullptr);

}  // namespace dtrain::runtime
