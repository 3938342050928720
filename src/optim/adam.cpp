// AdamW and LAMB: Adam moments with bias correction (states "exp_avg", "exp_avg_sq"),
// g read as g x grad_scale.
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,   bc_k = 1 - b_k^t  (t from 1)
// AdamW (PyTorch): p = p (1 - lr wd);  p = p - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
// LAMB: u = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd p;  r = ||p|| / ||u|| per segment
//   (1 when either is 0);  p = p - lr r u.  wd = 0 on no_decay segments.
// LAMB runs the two passes of kernels/optimizer.h over the fixed chunk table: moments +
// per-chunk norms, then the update with u recomputed bit-identically from (m, v, p),
// which costs flops but no buffer of the size of p. The trust ratios in between are
// computed here in double from the per-chunk sums, added in chunk order.
// A segment's lr_scale multiplies its learning rate (LAMB: lr x scale x trust ratio); a
// frozen segment is passed over (LAMB's chunk table leaves it out): its values stay, and
// it has no moments (optim/optimizer.h, drops_frozen_state).
#include <cmath>
#include <map>
#include <memory>

#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "kernels/optimizer.h"
#include "optim/algorithms.h"

namespace dtrain::optim::detail {
namespace {

// The step's scalars, computed in double and rounded once to f32 (the fused
// kernel's own argument, so AdamW passes them through unchanged).
kernels::AdamStep adam_coef(const OptimizerOptions& o, int64_t t, double lr, float grad_scale) {
  const double b1 = o.betas[0], b2 = o.betas[1];
  const double td = static_cast<double>(t);
  auto f = [](double x) { return static_cast<float>(x); };
  return {f(b1),
          f(1 - b1),
          f(b2),
          f(1 - b2),
          f(1 - std::pow(b1, td)),
          f(std::sqrt(1 - std::pow(b2, td))),
          f(o.eps),
          f(lr),
          0.0f,
          grad_scale};
}

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total, Device device)
      : Optimizer(o, std::move(s), total, {"exp_avg", "exp_avg_sq"}, device) {}

 private:
  void update(const ParamTarget& p, const Tensor& g, double lr, float grad_scale) override {
    const Tensor m = state_buffer(0), v = state_buffer(1);
    const kernels::AdamStep base = adam_coef(options(), step_, lr, grad_scale);
    for_each_range([&](int32_t segment, int64_t at, int64_t n) {
      const ParamSegment& seg = segments()[static_cast<size_t>(segment)];
      if (seg.frozen) return;
      const int64_t t = steps_of(segment);
      kernels::AdamStep k = t == step_ ? base : adam_coef(options(), t, lr, grad_scale);
      k.wd = decay_of(segment);
      if (seg.lr_scale != 1.0) k.lr = static_cast<float>(lr * seg.lr_scale);
      const Shape s{n};
      Tensor pt = param_range(p, segment, at, n), ct = copy_range(p, segment, at, n);
      Tensor mt = m.view(at, s), vt = v.view(at, s);
      kernels::adamw_step(k, pt, g.view(at, s), mt, vt, ct.defined() ? &ct : nullptr);
    });
  }
};

class Lamb final : public Optimizer {
 public:
  Lamb(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total, Device device)
      : Optimizer(o, std::move(s), total, {"exp_avg", "exp_avg_sq"}, device),
        ratio_(segments().size()) {
    for (const SegmentChunk& ch : chunks())
      if (!segments()[static_cast<size_t>(ch.segment)].frozen) live_.push_back(ch);
  }

 private:
  // The live chunks whose segments were frozen for the same number of steps (set_frozen_steps;
  // one group when none was): one bias correction, so one pass of each kernel, over their
  // table. A segment's chunks stay consecutive, in chunk order, within its group.
  struct Group {
    int64_t frozen = 0;
    std::vector<size_t> chunks;  // indices into live_
    Tensor ranges, wd;           // their table, on the device
    Tensor sums, sums_host;      // f64 [C, 2] per-chunk (sum p^2, sum u^2)
    Tensor step_dev, step_host;  // f32 [C] lr x trust ratio
    kernels::AdamStep k{};       // this step's scalars
  };

  // A host table's twin on the optimizer's device (the same tensor on the CPU).
  Tensor on_device(const Tensor& host, DType dt) const {
    if (device().is_cpu()) return host;
    Tensor t = Tensor::empty(host.shape(), dt, &kernels::device_allocator(device()));
    kernels::copy(host, t);
    return t;
  }

  // The groups for the frozen counts now, built again only when those changed (a resume's
  // set_frozen_steps: a live segment's count does not grow).
  void group_chunks() {
    std::vector<int64_t> key(live_.size(), 0);
    if (!frozen_steps_.empty()) {
      for (size_t c = 0; c < live_.size(); ++c)
        key[c] = frozen_steps_[static_cast<size_t>(live_[c].segment)];
    }
    if (!groups_.empty() && key == grouped_by_) return;
    grouped_by_ = key;
    std::map<int64_t, std::vector<size_t>> by_count;
    for (size_t c = 0; c < live_.size(); ++c) by_count[key[c]].push_back(c);
    groups_.clear();
    for (auto& [frozen, members] : by_count) {
      Group g;
      g.frozen = frozen;
      g.chunks = std::move(members);
      const auto n = static_cast<int64_t>(g.chunks.size());
      Tensor ranges = Tensor::empty(Shape{n, 2}, DType::i64);
      Tensor wd = Tensor::empty(Shape{n}, DType::f32);
      for (int64_t i = 0; i < n; ++i) {
        const SegmentChunk& ch = live_[g.chunks[static_cast<size_t>(i)]];
        ranges.data<int64_t>()[2 * i] = ch.begin;
        ranges.data<int64_t>()[2 * i + 1] = ch.end;
        wd.data<float>()[i] = decay_of(ch.segment);
      }
      g.sums_host = Tensor::empty(Shape{n, 2}, DType::f64);
      g.step_host = Tensor::empty(Shape{n}, DType::f32);
      g.ranges = on_device(ranges, DType::i64);
      g.wd = on_device(wd, DType::f32);
      g.sums = on_device(g.sums_host, DType::f64);
      g.step_dev = on_device(g.step_host, DType::f32);
      groups_.push_back(std::move(g));
    }
  }

  bool steps_views() const override { return false; }
  void set_segment_sums(SegmentSums combine) override { combine_ = std::move(combine); }

  void update(const ParamTarget& target, const Tensor& g, double lr, float grad_scale) override {
    if (live_.empty()) {  // every segment frozen: no update, but the ranks' sums are
      std::vector<double> ps(segments().size(), 0.0), us(segments().size(), 0.0);
      if (combine_) combine_(ps, us);  // collective (ZeRO, tensor parallelism)
      return;
    }
    group_chunks();
    Tensor p = target.flat;
    Tensor m = state_buffer(0), v = state_buffer(1);
    for (Group& gr : groups_) {  // each its own steps' bias correction
      gr.k = adam_coef(options(), step_ - gr.frozen, lr, grad_scale);
      kernels::lamb_moments(gr.k, gr.ranges, gr.wd, p, g, m, v, gr.sums);
      if (device().is_cuda()) kernels::copy(gr.sums, gr.sums_host);  // blocking: ratios need them
    }
    trust_ratios();
    for (Group& gr : groups_) {
      float* step = gr.step_host.data<float>();
      for (size_t i = 0; i < gr.chunks.size(); ++i) {
        const auto seg = static_cast<size_t>(live_[gr.chunks[i]].segment);
        step[i] = static_cast<float>(lr * segments()[seg].lr_scale * ratio_[seg]);
      }
      if (device().is_cuda()) kernels::copy(gr.step_host, gr.step_dev);
      kernels::lamb_update(gr.k, gr.ranges, gr.wd, gr.step_dev, p, m, v);
    }
    for (size_t s = 0; s < target.copies.size(); ++s) {  // the compute-dtype copy: a third pass
      if (segments()[s].frozen) continue;
      Tensor copy = target.copies[s];
      kernels::cast(p.view(segments()[s].offset, Shape{segments()[s].size}), copy);
    }
  }

  // Per segment: chunk sums added in chunk order (a segment's chunks are consecutive in
  // its group).
  void trust_ratios() {
    std::vector<double> ps(segments().size(), 0.0), us(segments().size(), 0.0);
    for (const Group& gr : groups_) {
      const double* sums = gr.sums_host.data<double>();
      for (size_t i = 0; i < gr.chunks.size(); ++i) {
        const auto seg = static_cast<size_t>(live_[gr.chunks[i]].segment);
        ps[seg] += sums[2 * i];
        us[seg] += sums[2 * i + 1];
      }
    }
    if (combine_) combine_(ps, us);  // ZeRO: the other ranks' pieces of each tensor
    for (size_t s = 0; s < ratio_.size(); ++s) {
      const double pn = std::sqrt(ps[s]), un = std::sqrt(us[s]);
      ratio_[s] = (pn > 0 && un > 0) ? pn / un : 1.0;
    }
  }

  std::vector<SegmentChunk> live_;  // the chunks of segments not frozen
  std::vector<Group> groups_;
  std::vector<int64_t> grouped_by_;  // per live chunk: the frozen count groups_ was built for
  std::vector<double> ratio_;        // per segment
  SegmentSums combine_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                      int64_t total, Device device) {
  return std::make_unique<AdamW>(o, std::move(s), total, device);
}

std::unique_ptr<Optimizer> make_lamb(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                     int64_t total, Device device) {
  return std::make_unique<Lamb>(o, std::move(s), total, device);
}

}  // namespace dtrain::optim::detail
