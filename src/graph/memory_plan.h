// The activation memory of one training step (or one evaluation) of a graph,
// replayed from the graph's specs by the executor's own rules, without allocating
// anything: what forward allocates (outputs, saved tensors), what lifetimes.h
// releases when, and what backward holds (the gradient frontier, input gradients,
// the parameter-gradient temporaries of half and tied parameters, the ops' declared
// backward temporaries). The executor's side of `dtrain estimate`; what lies outside
// a step (parameters, gradients, buffers, the workspace, optimizer state, data) is
// the caller's to add. Every allocation is rounded by `round` (the allocator's size
// class), so the sum is what the allocator reports.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "graph/executor.h"
#include "graph/graph.h"
#include "graph/param_units.h"

namespace dtrain::graph {

struct ActivationPeak {
  size_t peak = 0;  // bytes held at the step's high-water mark
  int node = -1;    // the node running then
  Phase phase = Phase::forward;
  size_t at_end = 0;  // still held after the step (pinned values, the loss)
};

// The executor's persistent allocations: parameters, f32 parameter gradients,
// buffers and the shared workspace (one allocation per flat dtype buffer).
struct ExecutorBytes {
  size_t params = 0, grads = 0, buffers = 0, workspace = 0;
};

using RoundBytes = std::function<size_t(size_t)>;

// ZeRO-2 (dist/zero_grads.h): parameter gradients live in buckets, one allocation each,
// made when backward first writes one of the bucket's parameters and freed once its
// last parameter's gradient is ready; they count with the step's activations.
struct GradBuckets {
  std::vector<int> bucket_of;  // per parameter
  std::vector<size_t> bytes;   // per bucket, rounded
};

// ZeRO-3 (runtime/zero_params.h): each unit's gather buffer, one allocation of its
// range in the compute dtype, made and freed as graph::GatherSchedule says before each
// node (then released at the end of the pass), and one f32 allocation per wide
// parameter of the unit (ParamUnit::wide); counted with the step's activations.
struct ParamGathers {
  const ParamUnits* units = nullptr;
  DType dtype = DType::f32;
  std::vector<FlatEntry> f32_layout;  // for the units' wide parameters
};

// blocks_per_segment: activation checkpointing as Executor::set_checkpointing.
ActivationPeak plan_activations(const Graph& graph, Mode mode, const std::vector<char>& pinned,
                                const RoundBytes& round, int blocks_per_segment = 0,
                                const GradBuckets* buckets = nullptr,
                                const ParamGathers* gathers = nullptr);
ExecutorBytes executor_bytes(const Graph& graph, Device device, const RoundBytes& round);

}  // namespace dtrain::graph
