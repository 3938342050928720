// The Optimizer base (tensor checks, step counter, state buffers and their
// checkpoint round trip) and make_optimizer. The update rules are sgd.cpp and adam.cpp.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "kernels/optimizer.h"
#include "optim/algorithms.h"

namespace dtrain::optim {
namespace {

void check_flat(const Tensor& t, int64_t total, Device device, const char* what) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::f32 && t.device() == device && t.numel() == total,
               "{} buffer must be f32 [{}] on {}, got {}", what, total, device.str(),
               t.defined() ? t.str() : "undefined");
}

std::string names_of(const std::vector<std::pair<std::string, Tensor>>& buffers) {
  std::string out;
  for (const auto& [name, t] : buffers) out += (out.empty() ? "" : ", ") + name;
  return "[" + out + "]";
}

void check_options(const OptimizerOptions& o) {
  auto bad = [](const char* key, double v, const char* want) {
    throw Error(fmt::format("optimizer.{} is {}; it must be {}", key, v, want),
                fmt::format("set optimizer.{} in the job file", key));
  };
  if (!(o.lr > 0) || !std::isfinite(o.lr)) bad("lr", o.lr, "a positive number");
  if (!(o.momentum >= 0 && o.momentum < 1)) bad("momentum", o.momentum, "in [0, 1)");
  for (double b : o.betas)
    if (!(b >= 0 && b < 1)) bad("betas", b, "in [0, 1)");
  if (!(o.eps > 0)) bad("eps", o.eps, "a positive number");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    bad("weight_decay", o.weight_decay, "a non-negative number");
  if (o.ema.decay && !(*o.ema.decay > 0 && *o.ema.decay < 1))
    bad("ema.decay", *o.ema.decay, "in (0, 1)");
  if (o.nesterov && (o.name != OptimizerName::sgd || o.momentum == 0))
    throw Error("optimizer.nesterov needs optimizer.name sgd with optimizer.momentum > 0",
                "set nesterov: false, or use sgd with a momentum");
}

}  // namespace

Optimizer::Optimizer(const OptimizerOptions& options, std::vector<ParamSegment> segments,
                     int64_t total_elems, const std::vector<std::string>& state_names,
                     Device device)
    : options_(options), segments_(std::move(segments)), total_(total_elems), device_(device) {
  check_segments(segments_, total_);
  chunks_ = chunk_segments(segments_);
  std::vector<std::string> names = state_names;
  if (has_ema()) names.emplace_back(kEmaBuffer);
  const bool holes = drops_frozen_state(segments_, device_);
  for (const std::string& name : names) {
    if (holes && name != kEmaBuffer) {  // frozen segments' pages read 0, commit nothing
      buffers_.emplace_back(name, Tensor::held_pages(Shape{total_}, DType::f32,
                                                     stateful_ranges(segments_), Unheld::zeros));
      continue;
    }
    Tensor t = Tensor::empty(Shape{total_}, DType::f32, &kernels::device_allocator(device_));
    kernels::fill(t, 0.0f);
    buffers_.emplace_back(name, std::move(t));
  }
}

std::vector<std::pair<int64_t, int64_t>> stateful_ranges(
    const std::vector<ParamSegment>& segments) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const ParamSegment& s : segments)
    if (!s.frozen) out.emplace_back(s.offset, s.offset + s.size);
  return out;
}

bool drops_frozen_state(const std::vector<ParamSegment>& segments, Device device) {
  return device.is_cpu() && std::any_of(segments.begin(), segments.end(),
                                        [](const ParamSegment& s) { return s.frozen; });
}

void Optimizer::load_state_piece(size_t buffer, int64_t at, const Tensor& piece) {
  DTRAIN_CHECK(buffer < buffers_.size() && at >= 0 && at + piece.numel() <= total_,
               "state piece [{}, {}) of buffer {} of {}", at, at + piece.numel(), buffer,
               buffers_.size());
  Tensor dst = buffers_[buffer].second;
  const int64_t end = at + piece.numel();
  const bool all = buffers_[buffer].first == kEmaBuffer;  // the average of every weight
  for (const ParamSegment& s : segments_) {
    if (s.frozen && !all) continue;  // its state is dropped: it restarts when unfrozen
    const int64_t a = std::max(at, s.offset), b = std::min(end, s.offset + s.size);
    if (a >= b) continue;
    Tensor out = dst.view(a, Shape{b - a});
    kernels::copy(piece.view(a - at, Shape{b - a}), out);
  }
}

void Optimizer::start_ema(const Tensor& params) {
  DTRAIN_CHECK(has_ema(), "start_ema without optimizer.ema");
  check_flat(params, total_, device_, "parameter");
  Tensor avg = ema();
  for_each_range([&](int32_t, int64_t at, int64_t n) {  // segments only: padding stays 0
    Tensor e = avg.view(at, Shape{n});
    kernels::copy(params.view(at, Shape{n}), e);
  });
  ema_ready_ = true;
}

double Optimizer::ema_decay_at(int64_t t) const {
  const double d = options_.ema.decay.value_or(0.0);
  if (!options_.ema.warmup) return d;
  return std::min(d, (1.0 + static_cast<double>(t)) / (10.0 + static_cast<double>(t)));
}

int state_buffer_count(const OptimizerOptions& o) {
  const int algorithm = o.name == OptimizerName::sgd ? (o.momentum > 0 ? 1 : 0) : 2;
  return algorithm + (o.ema.decay ? 1 : 0);
}

void Optimizer::step(const ParamTarget& target, const Tensor& grads, double lr, float grad_scale) {
  check_flat(grads, total_, device_, "gradient");
  DTRAIN_CHECK(std::isfinite(lr) && lr >= 0, "learning rate {}", lr);
  DTRAIN_CHECK(std::isfinite(grad_scale), "gradient scale {}", grad_scale);
  auto check_per_segment = [&](const std::vector<Tensor>& list, const char* what) {
    DTRAIN_CHECK(list.size() == segments_.size(), "{} {} for {} segments", list.size(), what,
                 segments_.size());
    for (size_t s = 0; s < list.size(); ++s) {
      const Tensor& t = list[s];
      DTRAIN_CHECK(
          t.defined() && t.device() == device_ && t.numel() == segments_[s].size &&
              (t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16),
          "{} of segment {} must be a float [{}] on {}, got {}", what, segments_[s].name,
          segments_[s].size, device_.str(), t.defined() ? t.str() : "undefined");
    }
  };
  if (target.flat.defined()) {
    check_flat(target.flat, total_, device_, "parameter");
    DTRAIN_CHECK(target.views.empty(), "a parameter target is flat or views, not both");
    if (!target.copies.empty()) check_per_segment(target.copies, "copies");
  } else {
    DTRAIN_CHECK(steps_views(), "the {} optimizer steps a flat f32 parameter buffer only",
                 to_string(name()));
    DTRAIN_CHECK(target.copies.empty(), "copies go with a flat parameter buffer");
    check_per_segment(target.views, "views");
  }
  ++step_;
  for (size_t s = 0; s < frozen_steps_.size(); ++s)
    if (segments_[s].frozen) ++frozen_steps_[s];
  if (!has_ema()) {
    update(target, grads, lr, grad_scale);
    return;
  }
  DTRAIN_CHECK(target.flat.defined(), "optimizer.ema averages a flat f32 parameter buffer");
  if (!ema_ready_) start_ema(target.flat);  // the weights before this step
  Tensor avg = ema();
  update(target, grads, lr, grad_scale);
  const auto rest = static_cast<float>(1.0 - ema_decay_at(step_));
  for_each_range([&](int32_t, int64_t at, int64_t n) {
    Tensor e = avg.view(at, Shape{n});
    kernels::ema_update(rest, target.flat.view(at, Shape{n}), e);
  });
}

Tensor Optimizer::param_range(const ParamTarget& t, int32_t segment, int64_t at, int64_t n) const {
  if (t.flat.defined()) return t.flat.view(at, Shape{n});
  const auto s = static_cast<size_t>(segment);
  return t.views[s].view(at - segments_[s].offset, Shape{n});
}

Tensor Optimizer::copy_range(const ParamTarget& t, int32_t segment, int64_t at, int64_t n) const {
  if (t.copies.empty()) return {};
  const auto s = static_cast<size_t>(segment);
  return t.copies[s].view(at - segments_[s].offset, Shape{n});
}

void Optimizer::for_each_range(const std::function<void(int32_t, int64_t, int64_t)>& fn) const {
  if (device_.is_cuda()) {
    for (size_t s = 0; s < segments_.size(); ++s)
      fn(static_cast<int32_t>(s), segments_[s].offset, segments_[s].size);
    return;
  }
  parallel_for(0, static_cast<int64_t>(chunks_.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const SegmentChunk& ch = chunks_[static_cast<size_t>(c)];
      fn(ch.segment, ch.begin, ch.end - ch.begin);
    }
  });
}

void Optimizer::set_frozen_steps(const std::map<std::string, int64_t>& by_name) {
  frozen_steps_.assign(segments_.size(), 0);
  bool any = false;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const auto it = by_name.find(segments_[s].name);
    if (it != by_name.end()) frozen_steps_[s] = std::clamp<int64_t>(it->second, 0, step_);
    if (segments_[s].frozen) frozen_steps_[s] = step_;  // no state: none of its steps count
    any = any || frozen_steps_[s] > 0 || segments_[s].frozen;
  }
  if (!any) frozen_steps_.clear();
}

OptimizerState Optimizer::state() const { return {step_, buffers_}; }

void Optimizer::load_state(const OptimizerState& saved) {
  const std::string want = names_of(buffers_);
  const std::string got = names_of(saved.buffers);
  if (want != got || saved.step < 0) {
    throw Error(fmt::format("optimizer state holds buffers {} at step {}; this {} optimizer "
                            "needs {}",
                            got, saved.step, to_string(name()), want),
                "resume with the optimizer.name the checkpoint was written with");
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Tensor& src = saved.buffers[i].second;
    if (src.dtype() != DType::f32 || src.numel() != total_) {
      throw Error(fmt::format("optimizer state buffer {} is {}; this model needs f32 [{}]",
                              saved.buffers[i].first, src.str(), total_),
                  "resume from a checkpoint of the same model and parallel layout");
    }
    if (src.raw() != buffers_[i].second.raw()) load_state_piece(i, 0, src);
  }
  step_ = saved.step;
  ema_ready_ = has_ema();
}

float Optimizer::decay_of(int32_t segment) const {
  const ParamSegment& s = segments_[static_cast<size_t>(segment)];
  if (s.weight_decay) return static_cast<float>(*s.weight_decay);  // optimizer.groups
  return s.decay == DecayMode::decay ? static_cast<float>(options_.weight_decay) : 0.0f;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          std::vector<ParamSegment> segments, int64_t total_elems,
                                          Device device) {
  check_options(options);
  switch (options.name) {
    case OptimizerName::sgd:
      return detail::make_sgd(options, std::move(segments), total_elems, device);
    case OptimizerName::adamw:
      return detail::make_adamw(options, std::move(segments), total_elems, device);
    case OptimizerName::lamb:
      return detail::make_lamb(options, std::move(segments), total_elems, device);
  }
  DTRAIN_CHECK(false, "unknown optimizer {}", static_cast<int>(options.name));
  return nullptr;
}

}  // namespace dtrain::optim
