// See master_weights.h.
#include "runtime/master_weights.h"

#include <algorithm>

#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::runtime {
namespace {

constexpr DType kParamDTypes[] = {DType::f32, DType::f16, DType::bf16};

std::vector<graph::FlatEntry> f32_layout(const graph::FlatStore& params) {
  std::vector<graph::FlatEntry> entries = params.entries();
  for (graph::FlatEntry& e : entries) e.spec.dtype = DType::f32;
  return entries;
}

// Each dtype's whole flat buffer (alignment padding included), `from` into `to`.
void copy_buffers(const graph::FlatStore& from, const graph::FlatStore& to) {
  for (DType dt : kParamDTypes) {
    const Tensor src = from.flat(dt);
    if (!src.defined()) continue;
    Tensor dst = to.flat(dt);
    kernels::copy(src, dst);
  }
}

}  // namespace

MasterWeights::MasterWeights(graph::Executor& ex, MasterMode mode, uint64_t seed, Device device,
                             bool offload, ShardRange shard, Tensor shard_grads,
                             Tensor shard_params)
    : ex_(ex),
      mode_(mode),
      device_(device),
      offload_(offload),
      shard_(shard),
      layout_(f32_layout(ex.params())) {
  for (size_t p = 0; p < layout_.entries().size(); ++p) {
    DTRAIN_CHECK(layout_.entries()[p].offset == ex.grads().entries()[p].offset &&
                     ex.grads().entries()[p].spec.dtype == DType::f32,
                 "the executor's gradient {} is not in the fp32 layout", layout_.entries()[p].name);
  }
  grads_ = ex.grads().flat(DType::f32);
  if (shard_grads.defined()) {  // ZeRO-2: the executor has no whole gradient buffer
    DTRAIN_CHECK(shard.sharded() && shard_grads.numel() == shard.size(),
                 "ZeRO-2 gradients of {} elements for a shard of {}", shard_grads.numel(),
                 shard.size());
    grads_ = std::move(shard_grads);
    grads_sharded_ = true;
  }
  if (mode_ == MasterMode::fp32) {
    for (const graph::FlatEntry& e : ex.params().entries()) {
      DTRAIN_CHECK(e.spec.dtype == DType::f32, "{} is {} in an fp32 run", e.name,
                   dtype_name(e.spec.dtype));
    }
  }
  const int64_t layout_elems = layout_.buffer_elems(DType::f32);
  if (!shard_.ranged()) shard_ = shard_of(layout_elems, 0, 1);
  Allocator* host = device.is_cuda() ? &kernels::pinned_host_allocator()
                                     : static_cast<Allocator*>(&host_allocator());
  if (shard_.ranged()) {
    DTRAIN_CHECK(mode_ != MasterMode::in_place,
                 "ZeRO and pipeline stages step a range of fp32 parameters or fp32 masters");
    DTRAIN_CHECK(shard_.end <= layout_elems, "shard [{}, {}) of {} elements", shard_.begin,
                 shard_.end, layout_elems);
    // ZeRO-Offload: this rank's shard of what the optimizer steps, and of the gradient
    // it reads, in host memory; the executor keeps whole parameters on the device.
    if (offload_) host_grads_ = Tensor::empty(Shape{shard_.size()}, DType::f32, host);
    if (shard_params.defined()) {  // ZeRO-3
      DTRAIN_CHECK(grads_sharded_ && shard_params.numel() == shard_.size(),
                   "ZeRO-3 parameters of {} elements for a shard of {}", shard_params.numel(),
                   shard_.size());
      param_shard_ = std::move(shard_params);
    }
    if (mode_ == MasterMode::fp32) {
      if (param_shard_.defined()) {
        layout_.initialize_range(seed, shard_.begin, param_shard_);
        target_.flat = param_shard_;
      } else {
        target_.flat = ex.params().flat(DType::f32).view(shard_.begin, Shape{shard_.size()});
      }
      if (offload_) {
        shard_host_params_ = Tensor::empty(Shape{shard_.size()}, DType::f32, host);
        kernels::copy(target_.flat, shard_host_params_);
        target_.flat = shard_host_params_;
      }
      return;
    }
    shard_masters_ = Tensor::empty(Shape{shard_.size()}, DType::f32,
                                   offload_ ? host : &kernels::device_allocator(device));
    layout_.initialize_range(seed, shard_.begin, shard_masters_);
    target_.flat = shard_masters_;
    if (param_shard_.defined()) {  // ZeRO-3: the range rounded, the rest is the others'
      publish_piece(shard_.begin, shard_masters_);
      return;
    }
    // Every half parameter from its f32 initial value, one tensor at a time (a pipeline
    // stage's: those its nodes use, a copy of a weight tied to an earlier stage included).
    for (int p = 0; p < ex.params().size(); ++p) {
      if (!ex.params().held(p)) continue;
      const graph::FlatEntry& e = layout_.entries()[static_cast<size_t>(p)];
      Tensor wide = Tensor::empty(e.spec.shape, DType::f32, &kernels::device_allocator(device));
      layout_.initialize_range(seed, e.offset, wide);
      Tensor dst = ex.params().view(p);
      kernels::cast(wide, dst);
    }
    return;
  }
  // The parameters the optimizer writes: the executor's own, or their host twin.
  graph::FlatStore* params = &ex.params();
  if (offload_) {
    twin_ = true;
    host_params_ = graph::FlatStore(ex.params().entries());
    host_params_.allocate_host(*host);
    copy_buffers(ex.params(), host_params_);  // the executor's initial bits
    host_grads_ = Tensor::empty(grads_.shape(), DType::f32, host);
    params = &host_params_;
  }
  if (mode_ == MasterMode::fp32) {
    target_.flat = params->flat(DType::f32);
    return;
  }
  std::vector<Tensor> views;
  for (int p = 0; p < params->size(); ++p) views.push_back(params->view(p));
  if (mode_ == MasterMode::masters) {
    if (offload_) {
      layout_.allocate_host(*host);
    } else {
      layout_.allocate(device);
    }
    layout_.initialize(seed);
    publish(layout_.flat(DType::f32));
    target_.flat = layout_.flat(DType::f32);
    target_.copies = std::move(views);
  } else {
    target_.views = std::move(views);
  }
}

void MasterWeights::publish(const Tensor& flat) {
  publish_piece(0, flat);
  if (twin_) upload();
}

void MasterWeights::upload() { copy_buffers(host_params_, ex_.params()); }

void MasterWeights::step(optim::Optimizer& opt, double lr, float grad_scale) {
  if (shard_.ranged()) {
    DTRAIN_CHECK(comm_ != nullptr || !shard_.sharded(), "ZeRO step before attach()");
    Tensor g = grads_sharded_ ? grads_ : grads_.view(shard_.begin, Shape{shard_.size()});
    if (offload_) {  // this rank's range of the summed gradient to the host
      kernels::copy(g, host_grads_);
      g = host_grads_;
    }
    opt.step(target_, g, lr, grad_scale);
    publish_range();
    return;
  }
  if (!offload_) {
    opt.step(target_, grads_, lr, grad_scale);
    return;
  }
  kernels::copy(grads_, host_grads_);  // blocking: waits for the backward that wrote them
  opt.step(target_, host_grads_, lr, grad_scale);
  upload();
}

// After the optimizer wrote this rank's range of target_.flat: every parameter the
// executor holds from it (gathered over the data group) and, from that, the compute-dtype
// copy.
void MasterWeights::publish_range(bool whole) {
  if (param_shard_.defined()) {  // ZeRO-3: the next forward gathers what it needs
    if (target_.flat.raw() != param_shard_.raw()) publish_piece(shard_.begin, target_.flat);
    return;
  }
  const bool covered = !whole && !cover_.empty() && shard_.sharded();
  const auto gather = [&](Tensor flat) {
    if (covered) {
      gather_cover(*comm_, std::move(flat), shard_, cover_, gather_piece_);
    } else if (shard_.sharded()) {
      gather_shards(*comm_, std::move(flat), shard_);
    }
  };
  if (mode_ == MasterMode::fp32) {
    Tensor flat = ex_.params().flat(DType::f32);
    if (offload_) {  // the stepped range back into the executor, then gathered there
      Tensor mine = flat.view(shard_.begin, Shape{shard_.size()});
      kernels::copy(shard_host_params_, mine);
    }
    gather(flat);
    return;
  }
  if (grads_sharded_) {  // no whole buffer to gather through: pieces, rounded as they come
    broadcast_shards(
        *comm_, shard_masters_, shard_, gather_piece_,
        [this](int64_t lo, const Tensor& values) { publish_piece(lo, values); },
        covered ? &cover_ : nullptr);
    return;
  }
  if (!shard_.sharded()) {  // a pipeline stage alone: its range rounded into its parameters
    publish_piece(shard_.begin, shard_masters_);
    return;
  }
  // The gradients are spent: their buffer carries the gathered masters, which every
  // rank then rounds into its half parameters (the span's: a pipeline stage's own).
  Tensor mine = grads_.view(shard_.begin, Shape{shard_.size()});
  kernels::copy(shard_masters_, mine);
  gather(grads_);
  if (!covered) {
    publish_piece(shard_.base, grads_.view(shard_.base, Shape{shard_.span}));
    return;
  }
  for (const auto& [lo, hi] : cover_) {
    const int64_t a = std::max(lo, shard_.base), b = std::min(hi, shard_.base + shard_.span);
    if (a < b) publish_piece(a, grads_.view(a, Shape{b - a}));
  }
}

void MasterWeights::exchange(Tensor& values) {
  Tensor& mine = target_.flat;
  DTRAIN_CHECK(mine.defined() && values.dtype() == DType::f32 && values.numel() == mine.numel() &&
                   values.device() == mine.device(),
               "exchange: f32 [{}] on {}, got {}", mine.defined() ? mine.numel() : 0,
               mine.defined() ? mine.device().str() : "-", values.str());
  // Piece by piece through one bounded temporary: no second copy of the weights.
  const int64_t n = mine.numel(), piece = std::min<int64_t>(n, int64_t{1} << 20);
  if (n > 0) {
    Tensor temp =
        Tensor::empty(Shape{piece}, DType::f32, &kernels::device_allocator(mine.device()));
    for (int64_t at = 0; at < n; at += piece) {
      const int64_t len = std::min(piece, n - at);
      Tensor t = temp.view(0, Shape{len}), a = mine.view(at, Shape{len}),
             b = values.view(at, Shape{len});
      kernels::copy(a, t);
      kernels::copy(b, a);
      kernels::copy(t, b);
    }
  }
  if (shard_.ranged()) {
    DTRAIN_CHECK(comm_ != nullptr || !shard_.sharded(), "ZeRO exchange before attach()");
    return publish_range(true);
  }
  if (mode_ == MasterMode::masters) return publish(mine);
  if (twin_) upload();  // fp32 offloaded: the host twin stepped, the executor's uploaded
}

Tensor MasterWeights::shard_params() const {
  if (shard_masters_.defined()) return shard_masters_;
  if (shard_host_params_.defined()) return shard_host_params_;
  if (param_shard_.defined()) return param_shard_;
  DTRAIN_CHECK(mode_ == MasterMode::fp32 && !offload_, "shard_params() of an unsharded layout");
  return ex_.params().flat(DType::f32).view(shard_.begin, Shape{shard_.size()});
}

graph::FlatStore& MasterWeights::state() {
  if (mode_ == MasterMode::fp32) return twin_ ? host_params_ : ex_.params();
  DTRAIN_CHECK(!shard_.ranged(), "ranged masters are saved by shard (shard_params())");
  if (mode_ == MasterMode::masters) return layout_;
  const graph::FlatStore& params = twin_ ? host_params_ : ex_.params();
  wide_ = std::make_unique<graph::FlatStore>(layout_.entries());
  wide_->allocate(params.device());
  for (int p = 0; p < wide_->size(); ++p) {
    Tensor dst = wide_->view(p);
    kernels::cast(params.view(p), dst);
  }
  return *wide_;
}

// A piece on another device than its destination goes through a temporary there.
void MasterWeights::publish_piece(int64_t lo, const Tensor& piece) {
  const int64_t hi = lo + piece.numel();
  if (param_shard_.defined()) {  // ZeRO-3: only this rank's range exists
    const int64_t a = std::max(lo, shard_.begin), b = std::min(hi, shard_.end);
    if (a >= b) return;
    Tensor dst = param_shard_.view(a - shard_.begin, Shape{b - a});
    Tensor src = piece.view(a - lo, Shape{b - a});
    if (!(dst.device() == src.device())) {
      Tensor there =
          Tensor::empty(src.shape(), DType::f32, &kernels::device_allocator(dst.device()));
      kernels::copy(src, there);
      src = there;
    }
    kernels::cast(src, dst);
    return;
  }
  graph::FlatStore& params = twin_ ? host_params_ : ex_.params();
  for (int p = 0; p < params.size(); ++p) {
    if (!params.held(p)) continue;  // another pipeline stage's
    const graph::FlatEntry& f = layout_.entries()[static_cast<size_t>(p)];
    const graph::FlatEntry& e = params.entries()[static_cast<size_t>(p)];
    const int64_t a = std::max(lo, f.offset), b = std::min(hi, f.offset + f.spec.shape.numel());
    if (a >= b) continue;
    Tensor dst = params.flat(e.spec.dtype).view(e.offset + (a - f.offset), Shape{b - a});
    Tensor src = piece.view(a - lo, Shape{b - a});
    if (!(dst.device() == src.device())) {  // a host piece for a device parameter
      Tensor there =
          Tensor::empty(src.shape(), DType::f32, &kernels::device_allocator(dst.device()));
      kernels::copy(src, there);
      src = there;
    }
    kernels::cast(src, dst);
  }
}

void MasterWeights::load_piece(int64_t lo, const Tensor& piece) {
  const int64_t n = piece.numel();
  if (mode_ == MasterMode::fp32) {  // the parameters themselves (or their host twin)
    if (param_shard_.defined() || !ex_.params().held_mask().empty()) {
      publish_piece(lo, piece);  // ZeRO-3: this rank's range of them; a stage: what it holds
    } else {
      Tensor dst = (twin_ ? host_params_ : ex_.params()).flat(DType::f32).view(lo, Shape{n});
      kernels::copy(piece, dst);
    }
    if (shard_host_params_.defined()) {  // ZeRO-Offload: this rank's range on the host
      const int64_t a = std::max(lo, shard_.begin), b = std::min(lo + n, shard_.end);
      if (a < b) {
        Tensor mine = shard_host_params_.view(a - shard_.begin, Shape{b - a});
        kernels::copy(piece.view(a - lo, Shape{b - a}), mine);
      }
    }
    return;
  }
  if (mode_ == MasterMode::masters) {
    if (shard_.ranged()) {
      const int64_t a = std::max(lo, shard_.begin), b = std::min(lo + n, shard_.end);
      if (a < b) {
        Tensor dst = shard_masters_.view(a - shard_.begin, Shape{b - a});
        kernels::copy(piece.view(a - lo, Shape{b - a}), dst);
      }
    } else {
      Tensor dst = layout_.flat(DType::f32).view(lo, Shape{n});
      kernels::copy(piece, dst);
    }
  }
  publish_piece(lo, piece);
}

void MasterWeights::finish_load() {
  if (twin_) upload();
}

void MasterWeights::state_loaded() {
  if (mode_ == MasterMode::masters) publish(layout_.flat(DType::f32));
  if (mode_ == MasterMode::in_place && wide_) publish(wide_->flat(DType::f32));
  if (mode_ == MasterMode::fp32 && twin_) upload();
}

}  // namespace dtrain::runtime
