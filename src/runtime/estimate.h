// `dtrain estimate`: the bytes one rank of a job holds, without allocating a tensor
// or touching a device. Model state from the layouts the trainer builds (parameters,
// f32 gradients, buffers, fp32 masters, optimizer state, the accumulation buffer),
// activations from graph::plan_activations (the executor's own release rule, replayed
// from the specs), the shared workspace and the data pipeline's batch buffers. Every
// allocation is rounded to the allocator's size class, as the allocator counts it.
// Asked for (EstimateOptions::step_time: `dtrain estimate` only), also the roofline step
// time (runtime/roofline.h), a lower bound.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/memory_plan.h"
#include "runtime/job.h"
#include "runtime/roofline.h"

namespace dtrain::runtime {

struct MemoryItem {
  std::string kind;  // "parameters", "gradients", ...
  size_t bytes = 0;
  std::string note;
};

struct MemoryEstimate {
  std::vector<MemoryItem> state;  // held for the whole run, on the device
  std::vector<MemoryItem> host;   // memory.offload.optimizer: in pinned host memory
  size_t host_bytes = 0;
  graph::ActivationPeak train, eval;        // on top of the state, per micro-batch step
  std::string train_peak_at, eval_peak_at;  // "backward of layer4.1.conv2"
  size_t state_bytes = 0;
  size_t peak_bytes = 0;  // state + the larger of the two activation peaks
  std::string peak_at;
  double step_flops = 0;  // forward + backward per rank and step (runtime::train_flops)
  // Backward's FLOPs over twice forward's: 1, less what optimizer.freeze skips.
  double backward_share = 1.0;
  // Forward FLOPs of one micro-batch on this rank: its part of the graph (tensor
  // parallelism), the worst stage's nodes (a pipeline).
  double forward_flops = 0;
  // The same part's parameter bytes (in the compute dtype) and op count: what each
  // micro-batch reads again and launches again, whatever its size (dtrain plan).
  double forward_param_bytes = 0;
  int64_t forward_ops = 0;
  // EstimateOptions::step_time: the roofline step time, or why there is none
  // ("no step time: this CPU has ...") in step_time_missing.
  std::optional<StepTimeEstimate> step_time;
  std::string step_time_missing;
  // parallel.pipeline > 1: each stage's activations (its part of the graph for up to
  // `in_flight` micro-batches at once, plus the copies of their inputs) on top of the
  // state, which every stage holds whole for now; train above is the worst stage's.
  struct Stage {
    int stage = 0, in_flight = 1;
    size_t train = 0, eval = 0, peak = 0;  // peak: state + the larger activations
    std::string at;                        // where its training peak is
  };
  std::vector<Stage> stages;
  // Bytes one rank moves per optimizer step over each axis of the grid, in nccl-tests'
  // bus convention (an all-reduce 2(n-1)/n of its buffer, a send or receive its bytes):
  // data, the gradient all-reduce; tensor, the split layers' all-reduces of activations
  // and their gradients (tensor_calls of them); pipeline, the busiest stage's sends and
  // receives. 0 on an axis of degree 1.
  struct Comm {
    double data = 0, tensor = 0, pipeline = 0;
    int64_t tensor_calls = 0;
    bool compressed = false;  // data: compress.method's exchanges (and ZeRO-1's gather)
    double data_dense = 0;    // compressed: the data axis's bytes without compression
    int zero_stage = 0;       // the data axis's ZeRO stage (0: the plain all-reduce)
  } comm;
  std::string caveat;  // what the figures leave out, said under the table
};

struct EstimateOptions {
  // The roofline step time. On the CPU it measures the host's peaks first (about 0.3 s,
  // once per process), so only `dtrain estimate` asks: not `dtrain train`'s check, not
  // `dtrain validate`, not fit_memory's search.
  bool step_time = false;
};

// memory.checkpointing as blocks per recomputed segment (0: none; block: 1; every_k:
// memory.every_k; sqrt: ceil(sqrt(blocks))), for Executor::set_checkpointing.
int blocks_per_segment(const Job& job, const graph::Graph& graph);

MemoryEstimate estimate_memory(const Job& job, const EstimateOptions& options = {});

// "2.61 GB", "12.3 MB", "4.5 kB"; "0.123 s", "4.56 ms", "789 us" (three significant
// figures): the estimate's and the planner's tables.
std::string format_bytes(double bytes);
std::string format_seconds(double seconds);

// The smallest change that brings the peak to at most `capacity` bytes: the job as it
// is; else, with several data-parallel ranks, ZeRO-1 then ZeRO-2 (sharded masters and
// optimizer state, then gradients: the same result; kept in every later candidate);
// else a smaller micro-batch (more
// accumulation micro-batches: the same global batch, hence the same result) down to half the job's;
// else `block` activation checkpointing (exact too, about a quarter more compute) at the largest
// micro-batch that fits; on CUDA then optimizer offload (masters and optimizer state to host
// memory), alone and with block checkpointing; else smaller micro-batches still.
// ZeRO-3 joins the search as it lands. `sets` are `--set` arguments `dtrain train`
// accepts.
struct FitAdvice {
  bool fits = false;
  std::vector<std::string> sets;  // empty when the job fits as it is
  MemoryEstimate estimate;        // of the job with `sets` applied (or the smallest tried)
};
FitAdvice fit_memory(const Job& job, size_t capacity);
std::string format_fit(const FitAdvice& advice, size_t capacity);

// What one rank may use: the GPU's memory, or on the CPU the host's available memory
// (/proc/meminfo MemAvailable) divided among the ranks on this machine.
size_t rank_capacity(const Job& job, int local_ranks);

// "80GB", "80 GiB", "512MB", "1e9": bytes, or a dtrain::Error naming `what`.
size_t parse_bytes(const std::string& text, const std::string& what);
std::string format_estimate(const MemoryEstimate& e);  // the table `dtrain estimate` prints

}  // namespace dtrain::runtime
