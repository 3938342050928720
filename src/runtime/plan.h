// The layout planner (`dtrain plan JOB.yaml --cluster CLUSTER.yaml`): every layout of
// the job over a cluster's devices that dtrain can run (pipeline x data x tensor,
// ZeRO stage, micro-batch size, activation checkpointing), each one's memory from
// `dtrain estimate`'s own model (the graph split and cut as the trainer does it) and
// a step time from its FLOPs, the bytes each axis moves and a link model; ranked.
// The model's assumptions, said once so the figures can be read:
//  - compute: each micro-batch's forward, backward (2x) and recompute at the device's
//    peak times `efficiency`, plus what every micro-batch pays whatever its size: its
//    part's parameters read three times (forward, both backward GEMMs) at the memory
//    bandwidth and three launches per op; a pipeline runs (m + p - 1) slots of its
//    slowest stage;
//  - the tensor axis: its all-reduces are not overlapped (the next op needs them), over
//    the link the tensor group spans (inside a node while it fits in one);
//  - the data axis: the estimate's bytes (the gradient all-reduce; ZeRO-2 and 3: a
//    reduce-scatter per micro-batch and the parameters' gathers) overlapped with the
//    last micro-batch's backward, only what is left over counted;
//  - the pipeline axis: each exchange is on the critical path;
//  - a link moves `bytes / bandwidth + latency` per message; a ring all-reduce over n
//    ranks sends 2(n - 1) messages.
#pragma once

#include <string>
#include <vector>

#include "runtime/estimate.h"
#include "runtime/job.h"

namespace dtrain::runtime {

struct Link {
  double bandwidth = 0;  // bytes per second, each way
  double latency = 0;    // seconds per message
};

struct Cluster {
  int nodes = 1, devices_per_node = 1;
  double memory_bytes = 0;          // per device
  double peak_flops = 0;            // per device, in the job's compute dtype
  double efficiency = 0.5;          // the share of the peak a layer achieves
  double memory_bandwidth = 900e9;  // bytes per second, the device's own memory
  double launch = 5e-6;             // seconds per op launch
  Link intra, inter;                // inside a node, between nodes
  int world() const { return nodes * devices_per_node; }
};

struct LayoutPlan {
  int pipeline = 1, data = 1, tensor = 1, zero_stage = 0;
  GridOrder order = GridOrder::pp_dp_tp;
  int micro_batch = 1, micro_batches = 1;
  bool checkpointing = false;
  size_t peak_bytes = 0;
  bool fits = false;
  // The step time and its parts (seconds): compute with the bubble, then what the
  // communication adds on each axis.
  double step = 0, compute = 0, bubble = 0, tensor_comm = 0, data_comm = 0, pipeline_comm = 0;
  double samples_per_s = 0;
  MemoryEstimate::Comm comm;  // bytes per step and rank, per axis
  bool tensor_inter = false, data_inter = false, pipeline_inter = false;  // over nodes?
  std::vector<std::string> sets;  // the --set lines `dtrain train` takes
  std::string why;                // what dominates, or why it does not fit
};

struct PlanResult {
  std::vector<LayoutPlan> layouts;   // those that fit by step time, then the rest by peak
  int considered = 0;                // layouts estimated
  std::vector<std::string> skipped;  // "tensor 4: model.heads ..." (one line per reason)
};

// Every layout of `job` over `cluster.world()` ranks. The job's global batch stays;
// its own parallel keys are replaced. Throws Error naming the cluster key when the
// cluster cannot hold any layout of the batch (a world that does not divide it).
PlanResult plan_layouts(const Job& job, const Cluster& cluster);

// The best `top` layouts as a table and each one's --set line.
std::string format_plan(const PlanResult& plan, const Cluster& cluster, int top);

}  // namespace dtrain::runtime
