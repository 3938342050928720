// Forward and backward over the static graph, in node order and reverse.
#include "graph/executor.h"

#include <algorithm>
#include <cstring>

#include "graph/layouts.h"
#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::graph {

namespace {

std::vector<Tensor> views(const FlatStore& store, const std::vector<int>& ids) {
  std::vector<Tensor> v;
  for (int i : ids) v.push_back(store.view(i));
  return v;
}

// The parameter layout with every gradient f32 (see executor.h).
std::vector<FlatEntry> f32_grad_layout(const Graph& graph) {
  std::vector<FlatEntry> entries = graph.param_layout();
  for (FlatEntry& e : entries) e.spec.dtype = DType::f32;
  return entries;
}

}  // namespace

Executor::Executor(const Graph& graph, Device device, GradBuffer grad_buffer,
                   ParamBuffer param_buffer, std::pair<int, int> stage,
                   std::vector<char> zero_grads)
    : params_owned_(param_buffer == ParamBuffer::owned),
      graph_(graph),
      device_(device),
      params_(graph.param_layout()),
      grads_(f32_grad_layout(graph)),
      buffers_(graph.buffer_layout()),
      values_(static_cast<size_t>(graph.num_values())),
      pinned_{std::vector<char>(static_cast<size_t>(graph.num_values()), 0),
              std::vector<char>(static_cast<size_t>(graph.num_values()), 0)},
      saved_(graph.nodes().size()) {
  end_ = static_cast<int>(graph.nodes().size());
  if (device_.is_cpu()) channel_block_ = kernels::cpu_channel_block();
  in_grads_.resize(static_cast<size_t>(graph.num_values()));
  std::vector<char> held;  // a stage's: the parameters its nodes use
  if (stage.second >= 0) {
    set_range(stage.first, stage.second);
    for (int p : first_user_) held.push_back(p >= 0 ? 1 : 0);
    if (std::find(held.begin(), held.end(), 0) == held.end()) held.clear();
    DTRAIN_CHECK(held.empty() || device_.is_cpu(),
                 "a stage's parameters alone are held on the host only, not on {}", device_.str());
  } else {
    user_ranges();
  }
  const auto allocate = [&](FlatStore& store) {
    if (held.empty()) {
      store.allocate(device_);
    } else {
      store.allocate_held(held);
    }
  };
  if (params_owned_) allocate(params_);
  if (std::find(zero_grads.begin(), zero_grads.end(), 1) != zero_grads.end()) {
    const bool owned = grad_buffer == GradBuffer::owned;
    DTRAIN_CHECK(zero_grads.size() == static_cast<size_t>(grads_.size()) && held.empty() &&
                     (device_.is_cpu() || !owned),
                 "zero gradients: {} flags for {} parameters, of the whole graph, on the host "
                 "unless the gradient storage is external",
                 zero_grads.size(), grads_.size());
    if (owned) {
      std::vector<char> backed(zero_grads.size());
      for (size_t p = 0; p < backed.size(); ++p) backed[p] = zero_grads[p] == 0 ? 1 : 0;
      grads_.allocate_held(backed, Unheld::zeros);
    }
    zero_grads_ = std::move(zero_grads);
  } else if (grad_buffer == GradBuffer::owned) {
    allocate(grads_);
  }
  buffers_.allocate(device_);
  const size_t ws = graph.max_workspace_bytes(device_);
  if (ws > 0) workspace_ = alloc({{static_cast<int64_t>(ws)}, DType::u8});
}

void Executor::user_ranges() {
  first_user_.assign(static_cast<size_t>(params_.size()), -1);
  last_user_.assign(static_cast<size_t>(params_.size()), -1);
  for (int i = end_ - 1; i >= begin_; --i) {
    const Node& n = graph_.nodes()[static_cast<size_t>(i)];
    for (size_t k = 0; k < n.params.size(); ++k) {
      const auto p = static_cast<size_t>(n.params[k]);
      for (size_t j = 0; j < k; ++j)
        DTRAIN_CHECK(n.params[j] != n.params[k], "node {} uses param {} twice", n.name, p);
      if (first_user_[p] < 0) first_user_[p] = i;
      last_user_[p] = i;
    }
  }
}

void Executor::set_range(int begin, int end) {
  const int n = static_cast<int>(graph_.nodes().size());
  DTRAIN_CHECK(0 <= begin && begin < end && end <= n, "range [{}, {}) of {} nodes", begin, end, n);
  begin_ = begin;
  end_ = end;
  blocks_stale_ = true;
  life_stale_[0] = life_stale_[1] = true;  // prunes() may change
  user_ranges();
  for (size_t p = 0; p < first_user_.size(); ++p) {
    DTRAIN_CHECK(first_user_[p] < 0 ||
                     (params_.held(static_cast<int>(p)) && grads_.held(static_cast<int>(p))),
                 "nodes [{}, {}) use {}, which this executor does not hold", begin, end,
                 params_.entries()[p].name);
  }
  check_segments();
}

void Executor::check_segments() {
  if (blocks_per_segment_ == 0) return;
  for (const Segment& s : lifetimes(Mode::train).segments) {
    const bool inside = s.first >= begin_ && s.last < end_;
    const bool outside = s.last < begin_ || s.first >= end_;
    DTRAIN_CHECK(inside || outside, "checkpointed nodes {}-{} straddle the range [{}, {})", s.first,
                 s.last, begin_, end_);
  }
}

void Executor::set_slots(int n) {
  DTRAIN_CHECK(n >= 1, "{} slots", n);
  select_slot(0);
  slots_.resize(static_cast<size_t>(n));
}

void Executor::select_slot(int k) {
  DTRAIN_CHECK(k >= 0 && k < static_cast<int>(slots_.size()), "slot {} of {}", k, slots_.size());
  if (k == slot_) return;
  Slot& out = slots_[static_cast<size_t>(slot_)];
  out.values.swap(values_);
  out.saved.swap(saved_);
  out.in_grads.swap(in_grads_);
  out.batch = batch_;
  Slot& in = slots_[static_cast<size_t>(k)];
  values_.swap(in.values);
  saved_.swap(in.saved);
  in_grads_.swap(in.in_grads);
  batch_ = in.batch;
  values_.resize(static_cast<size_t>(graph_.num_values()));
  saved_.resize(graph_.nodes().size());
  in_grads_.resize(static_cast<size_t>(graph_.num_values()));
  slot_ = k;
}

void Executor::set_value(ValueId v, Tensor t) {
  const Value& val = graph_.value(v);
  DTRAIN_CHECK(val.producer >= 0 && val.producer < begin_,
               "set_value: \"{}\" is not made before node {}", val.name, begin_);
  DTRAIN_CHECK(t.shape() == val.spec.shape && t.dtype() == val.spec.dtype && t.device() == device_,
               "set_value: \"{}\" expects {}{} on {}, got {}", val.name, dtype_name(val.spec.dtype),
               val.spec.shape.str(), device_.str(), t.str());
  values_[static_cast<size_t>(v)] = std::move(t);
}

void Executor::release_unused() {
  const Lifetimes& life = lifetimes(mode_);
  const BackwardSet set = backward_set();
  const std::vector<char> read =
      read_after_forward(graph_, life, mode_, begin_, end_, set.frozen.empty() ? nullptr : &set);
  for (size_t v = 0; v < values_.size(); ++v) {
    if (!values_[v].defined() || graph_.value(static_cast<ValueId>(v)).producer < 0) continue;
    if (life.last_use[v] < 0) continue;  // pinned, or read by nothing (the loss)
    if (!read[v]) values_[v] = Tensor();
  }
}

Tensor Executor::take_grad(ValueId v) { return std::move(in_grads_.at(static_cast<size_t>(v))); }

Tensor Executor::grad_view(int param) {
  if (grad_storage_) return grad_storage_(param);
  return grads_.view(param);
}

Tensor Executor::param_view(int param) const {
  if (params_owned_) return params_.view(param);
  DTRAIN_CHECK(param_storage_, "external parameters without set_param_storage");
  const Tensor t = param_storage_(param);
  const FlatEntry& e = params_.entries()[static_cast<size_t>(param)];
  DTRAIN_CHECK(t.shape() == e.spec.shape && t.dtype() == e.spec.dtype && t.device() == device_,
               "parameter {}: storage gave {}", e.name, t.str());
  return t;
}

std::vector<Tensor> Executor::param_views(const std::vector<int>& ids) const {
  std::vector<Tensor> v;
  for (int i : ids) v.push_back(param_view(i));
  return v;
}

Tensor Executor::alloc(const TensorSpec& s) const {
  return Tensor::empty(s.shape, s.dtype, &kernels::device_allocator(device_));
}

void Executor::initialize(uint64_t seed) {
  seed_ = seed;
  if (params_owned_) params_.initialize(seed);
  buffers_.initialize(seed);
}

void Executor::set_input(ValueId v, Tensor t) {
  const Value& val = graph_.value(v);
  if (val.producer != -1) throw Error(fmt::format("\"{}\" is not a graph input", val.name));
  if (!(t.shape() == val.spec.shape) || t.dtype() != val.spec.dtype || t.device() != device_) {
    throw Error(fmt::format("graph input \"{}\" expects {}{} on {}, got {}", val.name,
                            dtype_name(val.spec.dtype), val.spec.shape.str(), device_.str(),
                            t.str()));
  }
  values_[static_cast<size_t>(v)] = std::move(t);
}

const Tensor& Executor::value(ValueId v) const {
  const Tensor& t = values_.at(static_cast<size_t>(v));
  DTRAIN_CHECK(t.defined(), "value {} not computed, or released after its last use (keep() it)",
               graph_.value(v).name);
  return t;
}

Tensor Executor::value_or_meta(ValueId v) const {
  const Tensor& t = values_.at(static_cast<size_t>(v));
  if (t.defined()) return t;
  const TensorSpec& s = graph_.value(v).spec;
  return Tensor::meta(s.shape, s.dtype);
}

void Executor::keep(ValueId v) {
  keep(v, Mode::train);
  keep(v, Mode::eval);
}

void Executor::keep(ValueId v, Mode mode) {
  DTRAIN_CHECK(v >= 0 && v < graph_.num_values(), "keep: no value {}", v);
  const auto m = static_cast<size_t>(mode == Mode::train ? 0 : 1);
  pinned_[m][static_cast<size_t>(v)] = 1;
  life_stale_[m] = true;
  blocks_stale_ = true;
}

void Executor::set_channel_block(int64_t block) {
  // The workspace was sized for NCHW and this CPU's block (kernels::conv2d_workspace_bytes).
  DTRAIN_CHECK(block == 0 || (device_.is_cpu() && block == kernels::cpu_channel_block()),
               "channel block {} on {} (this CPU's is {})", block, device_.str(),
               kernels::cpu_channel_block());
  channel_block_ = block;
  blocks_stale_ = true;
}

std::vector<int32_t> Executor::value_blocks() const {
  std::vector<char> pinned(pinned_[0]);
  for (size_t v = 0; v < pinned.size(); ++v) pinned[v] = pinned[v] || pinned_[1][v];
  return channel_blocks(
      graph_, channel_block_, pinned, begin_, end_,
      channel_block_ > 0 && kernels::cpu_channel_block(DType::bf16) == channel_block_);
}

void Executor::bind_blocks(const Node& n, OpContext& ctx, std::vector<int32_t>& store) const {
  const std::vector<int32_t>& b = blocks_;
  DTRAIN_CHECK(b.size() == static_cast<size_t>(graph_.num_values()), "no layouts before forward");
  store.clear();
  for (ValueId v : n.inputs) store.push_back(b[static_cast<size_t>(v)]);
  for (ValueId v : n.outputs) store.push_back(b[static_cast<size_t>(v)]);
  ctx.input_blocks = std::span<const int32_t>(store).first(n.inputs.size());
  ctx.output_blocks = std::span<const int32_t>(store).subspan(n.inputs.size());
}

const Lifetimes& Executor::lifetimes(Mode mode) {
  const auto m = static_cast<size_t>(mode == Mode::train ? 0 : 1);
  if (life_stale_[m]) {
    const BackwardSet set = backward_set();  // pruned where this executor prunes
    life_[m] = plan_lifetimes(graph_, mode, pinned_[m], blocks_per_segment_, cuts_,
                              set.frozen.empty() ? nullptr : &set);
    life_stale_[m] = false;
  }
  return life_[m];
}

void Executor::release_after(const Lifetimes& life, int step) {
  for (ValueId v : life.release_after[static_cast<size_t>(step)])
    values_[static_cast<size_t>(v)] = Tensor();
}

void Executor::forward(Mode mode, uint64_t step, BatchKey batch) {
  mode_ = mode;
  step_ = step;
  batch_ = batch;
  const kernels::Workspace ws{workspace_.defined() ? workspace_.raw() : nullptr,
                              workspace_.defined() ? workspace_.nbytes() : 0, device_};
  // The previous step's values (pinned ones, the loss) and saved tensors go first;
  // graph inputs and what earlier stages made (set_value) stay.
  for (size_t v = 0; v < values_.size(); ++v)
    if (graph_.value(static_cast<ValueId>(v)).producer >= begin_) values_[v] = Tensor();
  for (auto& s : saved_) s.clear();
  if (blocks_stale_) {  // this step's layouts, until its backward ends
    blocks_ = value_blocks();
    blocks_stale_ = false;
  }
  const Lifetimes& life = lifetimes(mode);
  for (size_t i = static_cast<size_t>(begin_); i < static_cast<size_t>(end_); ++i) {
    if (hooks.pre_op) hooks.pre_op(static_cast<int>(i), Phase::forward);
    run_forward(static_cast<int>(i), false);
    if (hooks.post_op) hooks.post_op(static_cast<int>(i), Phase::forward);
    // An evaluation drops the saved tensors now; so does a checkpointed segment (its
    // recompute makes them again), and a node that runs no backward (set_frozen).
    if (mode == Mode::eval || life.segment_of[i] >= 0 ||
        (prunes() && !frozen_.runs(static_cast<int>(i))))
      saved_[i].clear();
    release_after(life, static_cast<int>(i));
  }
}

// Node `index`'s forward: its outputs into values_ (reusing an output that is still
// held, which a recompute then overwrites with the same bits), its saved tensors into
// saved_.
void Executor::run_forward(int index, bool recompute) {
  const Node& n = graph_.nodes()[static_cast<size_t>(index)];
  const kernels::Workspace ws{workspace_.defined() ? workspace_.raw() : nullptr,
                              workspace_.defined() ? workspace_.nbytes() : 0, device_};
  std::vector<Tensor> in, out, saved;
  for (ValueId v : n.inputs) in.push_back(value(v));
  for (ValueId v : n.outputs) {
    const Tensor& held = values_[static_cast<size_t>(v)];
    out.push_back(held.defined() ? held : alloc(graph_.value(v).spec));
  }
  for (const TensorSpec& s : n.info.saved) saved.push_back(alloc(s));
  std::vector<Tensor> p = param_views(n.params), b = views(buffers_, n.buffers);
  OpContext ctx{mode_, seed_, step_, static_cast<uint32_t>(index), in, out, p, b, saved, ws,
                {},    {},    {}};
  ctx.math = math_;
  ctx.batch = batch_;
  ctx.recompute = recompute;
  std::vector<int32_t> blocks;
  bind_blocks(n, ctx, blocks);
  n.op->forward(ctx);
  for (size_t o = 0; o < n.outputs.size(); ++o) values_[static_cast<size_t>(n.outputs[o])] = out[o];
  saved_[static_cast<size_t>(index)] = std::move(saved);
}

bool Executor::in_place_grad(const Lifetimes& life, const Node& n, size_t k, int step) const {
  if (n.info.grad_in_place != static_cast<int>(k)) return false;
  const ValueId v = n.inputs[k];
  return grad_in_place_ok(graph_, life, v, step) && values_[static_cast<size_t>(v)].defined();
}

void Executor::set_checkpointing(int blocks_per_segment, std::vector<int> cuts) {
  DTRAIN_CHECK(blocks_per_segment >= 0, "blocks per segment {}", blocks_per_segment);
  cuts_ = std::move(cuts);
  blocks_per_segment_ = blocks_per_segment;
  life_stale_[0] = life_stale_[1] = true;
  check_segments();
}

// The forward of a checkpointed segment again, just before its backward.
void Executor::recompute(const Lifetimes& life, const Segment& segment) {
  for (int j = segment.first; j <= segment.last; ++j) {
    if (hooks.pre_op) hooks.pre_op(j, Phase::recompute);
    run_forward(j, true);
    if (hooks.post_op) hooks.post_op(j, Phase::recompute);
    for (ValueId v : life.recompute_release[static_cast<size_t>(j)])
      values_[static_cast<size_t>(v)] = Tensor();
  }
}

void Executor::backward(ValueId loss, float dloss) { backward({}, loss, dloss); }

void Executor::backward(const std::vector<std::pair<ValueId, Tensor>>& seeds, ValueId loss,
                        float dloss) {
  DTRAIN_CHECK(mode_ == Mode::train, "backward after an evaluation forward");
  DTRAIN_CHECK(zero_grads_.empty() || !frozen_.scratch.empty(),
               "zero gradients without set_frozen naming them");
  std::vector<Tensor> vgrad(values_.size());
  if (loss >= 0) {
    const Value& lv = graph_.value(loss);
    DTRAIN_CHECK(lv.spec.shape.numel() == 1 && lv.spec.dtype == DType::f32,
                 "backward from {} {}: the loss must be one f32", lv.name, lv.spec.shape.str());
    DTRAIN_CHECK(lv.producer >= begin_ && lv.producer < end_, "the loss {} is not in the range",
                 lv.name);
    Tensor seed = alloc(lv.spec);
    kernels::fill(seed, dloss);
    vgrad[static_cast<size_t>(loss)] = seed;
  }
  for (const auto& [v, g] : seeds) {
    const Value& val = graph_.value(v);
    DTRAIN_CHECK(val.producer >= 0 && val.producer < end_ && g.shape() == val.spec.shape &&
                     g.dtype() == val.spec.dtype && g.device() == device_,
                 "backward seed for \"{}\": {}", val.name, g.str());
    vgrad[static_cast<size_t>(v)] = g;
  }
  const Lifetimes& life = lifetimes(Mode::train);
  for (int i = end_ - 1; i >= begin_; --i) {
    const int seg = life.segment_of[static_cast<size_t>(i)];
    if (seg >= 0 && life.segments[static_cast<size_t>(seg)].last == i) {
      // Not where no node of it runs backward (set_frozen).
      if (life.recomputed[static_cast<size_t>(seg)])
        recompute(life, life.segments[static_cast<size_t>(seg)]);
    }
    backward_node(i, vgrad);
  }
  // What earlier stages made: their gradients go back; nothing of the micro-batch stays
  // but pinned values and the loss.
  for (size_t v = 0; v < values_.size(); ++v) {
    const int producer = graph_.value(static_cast<ValueId>(v)).producer;
    if (producer >= 0 && producer < begin_) in_grads_[v] = std::move(vgrad[v]);
    if (producer >= 0 && life.last_use[v] >= 0) values_[v] = Tensor();
  }
}

std::vector<Tensor> Executor::grad_targets(const Node& n, int index, uint32_t& accumulate) {
  std::vector<Tensor> gp;
  accumulate = 0;
  for (size_t k = 0; k < n.params.size(); ++k) {
    const int p = n.params[k];
    if (frozen_.skips_grad(n,
                           k)) {  // frozen: none computed; its first user zeroes it, as a skipped
      gp.emplace_back();          // node's does
      if (first_user_[static_cast<size_t>(p)] == index && !zero_grad(p)) {
        Tensor g = grad_view(p);
        kernels::fill(g, 0.0f);
      }
      continue;
    }
    const TensorSpec half{params_.entries()[static_cast<size_t>(p)].spec.shape,
                          params_.entries()[static_cast<size_t>(p)].spec.dtype};
    const bool direct = half_grad_in_f32(*n.op, k, half.dtype);
    if (zero_grad(p)) {  // computed into a transient tensor and dropped
      gp.push_back(alloc({half.shape, direct ? DType::f32 : half.dtype}));
      continue;
    }
    DTRAIN_CHECK(!direct || n.op->can_accumulate_param_grad(k),
                 "{}: writes param {}'s gradient in f32 but cannot accumulate it", n.name, k);
    if (direct) {  // the op writes the f32 gradient itself
      gp.push_back(grad_view(p));
      if (first_user_[static_cast<size_t>(p)] != index) accumulate |= 1u << k;
    } else if (half.dtype != DType::f32) {  // the op writes its dtype; widened into grads_ after
      gp.push_back(alloc(half));
    } else if (first_user_[static_cast<size_t>(p)] == index) {
      gp.push_back(grad_view(p));
    } else if (k < 32 && n.op->can_accumulate_param_grad(k)) {
      gp.push_back(grad_view(p));
      accumulate |= 1u << k;
    } else {
      gp.push_back(alloc({grads_.entries()[static_cast<size_t>(p)].spec.shape,
                          grads_.entries()[static_cast<size_t>(p)].spec.dtype}));
    }
  }
  return gp;
}

void Executor::backward_node(int index, std::vector<Tensor>& vgrad) {
  const Node& n = graph_.nodes()[static_cast<size_t>(index)];
  bool reached = false;
  for (ValueId v : n.outputs) reached = reached || vgrad[static_cast<size_t>(v)].defined();
  const bool pruned = reached && prunes() && !frozen_.runs(index);
  if (!reached || pruned) {  // the loss does not depend on this node (or, set_frozen,
                             // only frozen parameters do): its contributions are zero
    for (int p : n.params) {
      if (first_user_[static_cast<size_t>(p)] != index || zero_grad(p)) continue;
      Tensor g = grad_view(p);
      kernels::fill(g, 0.0f);
    }
  } else {
    uint32_t accumulate = 0;
    std::vector<Tensor> gp = grad_targets(n, index, accumulate);
    if (hooks.pre_op) hooks.pre_op(index, Phase::backward);
    std::vector<Tensor> in, out, dout, din, fresh;
    for (ValueId v : n.inputs) in.push_back(value_or_meta(v));
    for (ValueId v : n.outputs) {
      out.push_back(value_or_meta(v));
      Tensor& g = vgrad[static_cast<size_t>(v)];
      if (!g.defined() && graph_.value(v).requires_grad) {  // an output the loss ignores
        g = alloc(graph_.value(v).spec);
        kernels::fill(g, 0.0f);
      }
      dout.push_back(g);  // undefined for an integer output (gathered labels)
    }
    const Lifetimes& life = lifetimes(Mode::train);
    const int step = 2 * static_cast<int>(graph_.nodes().size()) - 1 - index;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const ValueId v = n.inputs[k];
      // set_frozen: no gradient for an input nothing above which trains.
      const bool need = graph_.value(v).requires_grad && (!prunes() || frozen_.wants(v));
      // A value used twice (a residual) gets its gradient contributions summed.
      if (need && in_place_grad(life, n, k, step)) {
        din.push_back(values_[static_cast<size_t>(v)]);  // over the input, which dies here
      } else {
        din.push_back(need ? alloc(graph_.value(v).spec) : Tensor());
      }
    }
    std::vector<Tensor> p = param_views(n.params), b = views(buffers_, n.buffers);
    const kernels::Workspace ws{workspace_.defined() ? workspace_.raw() : nullptr,
                                workspace_.defined() ? workspace_.nbytes() : 0, device_};
    OpContext ctx{mode_, seed_, step_, static_cast<uint32_t>(index),       in,
                  out,   p,     b,     saved_[static_cast<size_t>(index)], ws,
                  dout,  din,   gp};
    ctx.accumulate_mask = accumulate;
    ctx.math = math_;
    ctx.batch = batch_;
    std::vector<int32_t> blocks;
    bind_blocks(n, ctx, blocks);
    n.op->backward(ctx);
    for (size_t k = 0; k < n.params.size(); ++k) {
      if (!gp[k].defined() || zero_grad(n.params[k])) continue;  // frozen: none kept
      Tensor total = grad_view(n.params[k]);
      const bool first = first_user_[static_cast<size_t>(n.params[k])] == index;
      if (gp[k].dtype() != DType::f32) {  // a half weight gradient: widened, summed in f32
        if (first) {
          kernels::cast(gp[k], total);
        } else {
          Tensor wide = alloc({gp[k].shape(), DType::f32});
          kernels::cast(gp[k], wide);
          kernels::axpy(1.0f, wide, total);
        }
        continue;
      }
      if (first) continue;
      if ((accumulate >> k) & 1u) continue;  // the op added it in itself
      kernels::axpy(1.0f, gp[k], total);
    }
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!din[k].defined()) continue;
      Tensor& acc = vgrad[static_cast<size_t>(n.inputs[k])];
      if (acc.defined()) {
        kernels::axpy(1.0f, din[k], acc);
      } else {
        acc = din[k];
      }
    }
    if (hooks.post_op) hooks.post_op(index, Phase::backward);
  }
  // Every consumer of this node's outputs ran backward before it, so their
  // gradients and this node's saved tensors are dead: give the memory back now
  // (the peak is then the activations plus a frontier of gradients, not both sets).
  for (ValueId v : n.outputs) vgrad[static_cast<size_t>(v)] = Tensor();
  saved_[static_cast<size_t>(index)].clear();
  const int n_nodes = static_cast<int>(graph_.nodes().size());
  release_after(lifetimes(Mode::train), 2 * n_nodes - 1 - index);
  for (int p : n.params) {
    if (last_user_[static_cast<size_t>(p)] != index) continue;
    if (frozen_.is_frozen(p) && !zero_grad(p)) {
      Tensor g = grad_view(p);
      kernels::fill(g, 0.0f);
    }
    if (hooks.grad_ready) hooks.grad_ready(p);
  }
}

void Executor::set_frozen(std::vector<uint8_t> frozen) {
  DTRAIN_CHECK(frozen.empty() || frozen.size() == params_.entries().size(),
               "{} frozen flags for {} parameters", frozen.size(), params_.entries().size());
  frozen_ = graph::backward_set(graph_, std::move(frozen), true);
  frozen_.scratch = zero_grads_;
  life_stale_[0] = life_stale_[1] = true;
  for (size_t p = 0; p < zero_grads_.size(); ++p) {
    DTRAIN_CHECK(!zero_grads_[p] || frozen_.is_frozen(static_cast<int>(p)),
                 "{}: a zero gradient for a parameter not frozen", params_.entries()[p].name);
  }
}

BackwardSet Executor::backward_set() const {
  BackwardSet set = frozen_;
  if (!prunes()) set.works.clear(), set.needs.clear();
  return set;
}

bool Executor::prunes() const {
  return !frozen_.works.empty() && params_owned_ && begin_ == 0 &&
         end_ == static_cast<int>(graph_.nodes().size());
}

}  // namespace dtrain::graph
