// The Optimizer base (tensor checks, step counter, state buffers and their
// checkpoint round trip) and make_optimizer. The update rules are sgd.cpp and adam.cpp.
#include "optim/optimizer.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/algorithms.h"

namespace dtrain::optim {
namespace {

void check_flat(const Tensor& t, int64_t total, const char* what) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::f32 && t.device().is_cpu() && t.numel() == total,
               "{} buffer must be host f32 [{}], got {}", what, total,
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
  if (o.nesterov && (o.name != OptimizerName::sgd || o.momentum == 0))
    throw Error("optimizer.nesterov needs optimizer.name sgd with optimizer.momentum > 0",
                "set nesterov: false, or use sgd with a momentum");
}

}  // namespace

Optimizer::Optimizer(const OptimizerOptions& options, std::vector<ParamSegment> segments,
                     int64_t total_elems, const std::vector<std::string>& state_names)
    : options_(options), segments_(std::move(segments)), total_(total_elems) {
  check_segments(segments_, total_);
  chunks_ = chunk_segments(segments_);
  for (const std::string& name : state_names) {
    Tensor t = Tensor::empty(Shape{total_}, DType::f32);
    std::memset(t.raw(), 0, t.nbytes());
    buffers_.emplace_back(name, std::move(t));
  }
}

void Optimizer::step(Tensor& params, const Tensor& grads, double lr) {
  check_flat(params, total_, "parameter");
  check_flat(grads, total_, "gradient");
  DTRAIN_CHECK(std::isfinite(lr) && lr >= 0, "learning rate {}", lr);
  ++step_;
  update(params.data<float>(), grads.data<float>(), lr);
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
    std::memcpy(buffers_[i].second.raw(), src.data<float>(), src.nbytes());
  }
  step_ = saved.step;
}

float Optimizer::decay_of(const SegmentChunk& c) const {
  const bool decays = segments_[static_cast<size_t>(c.segment)].decay == DecayMode::decay;
  return decays ? static_cast<float>(options_.weight_decay) : 0.0f;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          std::vector<ParamSegment> segments, int64_t total_elems) {
  check_options(options);
  switch (options.name) {
    case OptimizerName::sgd:
      return detail::make_sgd(options, std::move(segments), total_elems);
    case OptimizerName::adamw:
      return detail::make_adamw(options, std::move(segments), total_elems);
    case OptimizerName::lamb:
      return detail::make_lamb(options, std::move(segments), total_elems);
  }
  DTRAIN_CHECK(false, "unknown optimizer {}", static_cast<int>(options.name));
  return nullptr;
}

}  // namespace dtrain::optim
