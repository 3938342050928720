// ZeRO-3's parameters: each rank keeps only its range [begin, end) of the fp32 layout
// (runtime/zero.h), in the compute dtype, and the executor (graph::ParamBuffer::
// external) sees a parameter only while its unit is gathered (graph/param_units.h):
// before each node the pre_op hook releases the units it no longer needs, gathers
// the ones it uses (one all-gather of the unit's range, the ranks' pieces of it
// unequal: Communicator::all_gatherv_async) and starts gathering the next node's
// while this one computes. The gathered values are the owners' bits, so the model
// computes with exactly the parameters a replicated run holds. In a half run the
// parameters the policy keeps in f32 (the norms') come from the f32 masters' range,
// each gathered on its own (graph::ParamUnit::wide).
// The shard may live elsewhere than the communicator (memory.offload.params: pinned
// host memory next to a GPU): each rank's own piece is copied into the gather buffer
// on the communicator's device.
#pragma once

#include <vector>

#include "dist/communicator.h"
#include "graph/param_units.h"
#include "runtime/zero.h"

namespace dtrain::runtime {

class ShardedParams {
 public:
  // shard: this rank's range of `units`' layout; params: [shard.size()] in the compute
  // dtype (kept by the caller: the optimizer's target in fp32, the rounded masters
  // otherwise); wide: the same range in f32 (the masters; in fp32 `params` itself);
  // device: where gathered units live (the executor's).
  ShardedParams(const graph::Graph& graph, const graph::ParamUnits& units, ShardRange shard,
                Tensor params, Tensor wide, Device device);
  void attach(dist::Communicator& comm);  // the data-parallel group, on `device`
  const Tensor& shard_params() const { return params_; }

  void before(int node, graph::Phase phase);  // the executor's pre_op hook
  Tensor view(int param) const;               // the executor's parameter storage
  void end_pass();                            // after backward, after an evaluation

 private:
  void start(int unit);
  void release(int unit);
  void wait(int unit);
  // [lo, hi) of the layout from `from` (this rank's range) into `buf`, all-gathered.
  dist::Handle gather(const Tensor& from, int64_t lo, int64_t hi, Tensor buf);

  const graph::Graph& graph_;
  const graph::ParamUnits& units_;
  graph::GatherSchedule schedule_;
  std::vector<graph::FlatEntry> layout_;  // the fp32 layout (f32 offsets)
  ShardRange shard_;
  Tensor params_, wide_;
  Device device_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // every rank's range
  dist::Communicator* comm_ = nullptr;
  std::vector<Tensor> gathered_;                    // per unit: the buffer, or undefined
  std::vector<std::vector<dist::Handle>> pending_;  // per unit: its gathers, until waited
  std::vector<Tensor> wide_gathered_;               // per parameter (the wide ones)
};

}  // namespace dtrain::runtime
