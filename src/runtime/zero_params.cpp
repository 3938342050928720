// See zero_params.h.
#include "runtime/zero_params.h"

#include <algorithm>

#include "kernels/memory.h"

namespace dtrain::runtime {

namespace {

graph::FlatStore f32_layout(const graph::Graph& graph) {
  std::vector<graph::FlatEntry> entries = graph.param_layout();
  for (graph::FlatEntry& e : entries) e.spec.dtype = DType::f32;
  return graph::FlatStore(std::move(entries));  // offsets in f32 elements
}

}  // namespace

ShardedParams::ShardedParams(const graph::Graph& graph, const graph::ParamUnits& units,
                             ShardRange shard, Tensor params, Tensor wide, Device device)
    : graph_(graph),
      units_(units),
      schedule_(units),
      layout_(f32_layout(graph).entries()),
      shard_(shard),
      params_(std::move(params)),
      wide_(std::move(wide)),
      device_(device),
      gathered_(units.units().size()),
      pending_(units.units().size()),
      wide_gathered_(graph.param_layout().size()) {
  DTRAIN_CHECK(shard_.sharded() && params_.numel() == shard_.size() &&
                   wide_.numel() == shard_.size() && wide_.dtype() == DType::f32,
               "ZeRO-3 parameters {} and {} for a shard of {}", params_.str(), wide_.str(),
               shard_.size());
  const int64_t total = f32_layout(graph).buffer_elems(DType::f32);
  for (int r = 0; r < shard_.world; ++r) {
    const ShardRange s = shard_of(total, r, shard_.world);
    ranges_.emplace_back(s.begin, s.end);
  }
}

void ShardedParams::attach(dist::Communicator& comm) {
  DTRAIN_CHECK(comm.device() == device_ && comm.size() == shard_.world,
               "ZeRO-3 over {} ranks on {} for a shard of {} ranks on {}", comm.size(),
               comm.device().str(), shard_.world, device_.str());
  comm_ = &comm;
}

dist::Handle ShardedParams::gather(const Tensor& from, int64_t lo, int64_t hi, Tensor buf) {
  std::vector<int64_t> counts;
  for (const auto& [b, e] : ranges_)
    counts.push_back(std::max<int64_t>(0, std::min(e, hi) - std::max(b, lo)));
  const int64_t a = std::max(lo, shard_.begin), z = std::min(hi, shard_.end);
  if (a < z) {  // this rank's piece, from wherever the shard lives
    Tensor mine = buf.view(a - lo, Shape{z - a});
    kernels::copy(from.view(a - shard_.begin, Shape{z - a}), mine);
  }
  return comm_->all_gatherv_async(std::move(buf), std::move(counts));
}

void ShardedParams::start(int unit) {
  DTRAIN_CHECK(comm_ != nullptr, "ZeRO-3 gather before attach()");
  const graph::ParamUnit& u = units_.units()[static_cast<size_t>(unit)];
  auto& pending = pending_[static_cast<size_t>(unit)];
  Tensor buf =
      Tensor::empty(Shape{u.hi - u.lo}, params_.dtype(), &kernels::device_allocator(device_));
  pending.push_back(gather(params_, u.lo, u.hi, buf));
  gathered_[static_cast<size_t>(unit)] = std::move(buf);
  for (int p : u.wide) {  // f32 parameters of a half run, from the masters
    const graph::FlatEntry& e = layout_[static_cast<size_t>(p)];
    Tensor w = Tensor::empty(e.spec.shape, DType::f32, &kernels::device_allocator(device_));
    pending.push_back(gather(wide_, e.offset, e.offset + e.spec.shape.numel(),
                             w.view(0, Shape{e.spec.shape.numel()})));
    wide_gathered_[static_cast<size_t>(p)] = std::move(w);
  }
}

void ShardedParams::wait(int unit) {
  for (dist::Handle& h : pending_[static_cast<size_t>(unit)]) h.wait();
  pending_[static_cast<size_t>(unit)].clear();
}

void ShardedParams::release(int unit) {
  wait(unit);  // the communicator may still be writing into them
  gathered_[static_cast<size_t>(unit)] = Tensor();
  for (int p : units_.units()[static_cast<size_t>(unit)].wide)
    wide_gathered_[static_cast<size_t>(p)] = Tensor();
}

void ShardedParams::before(int node, graph::Phase phase) {
  const graph::GatherActions a = schedule_.before(node, phase);
  for (int u : a.release) release(u);
  for (int u : a.acquire) {
    if (!gathered_[static_cast<size_t>(u)].defined()) start(u);
  }
  for (int u : a.prefetch) start(u);  // overlaps this node's op
  for (int u : a.acquire) wait(u);
}

Tensor ShardedParams::view(int param) const {
  const int u = units_.unit_of(param);
  const graph::FlatEntry& e = layout_[static_cast<size_t>(param)];
  const Tensor& buf = gathered_[static_cast<size_t>(u)];
  DTRAIN_CHECK(buf.defined() && pending_[static_cast<size_t>(u)].empty(),
               "ZeRO-3: {} used while its block is not gathered", e.name);
  if (wide_gathered_[static_cast<size_t>(param)].defined())
    return wide_gathered_[static_cast<size_t>(param)];
  return buf.view(e.offset - units_.units()[static_cast<size_t>(u)].lo, e.spec.shape);
}

void ShardedParams::end_pass() {
  for (int u : schedule_.end_pass()) release(u);
}

}  // namespace dtrain::runtime
