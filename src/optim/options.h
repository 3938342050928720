// Typed options of the optimizer module (SGD, AdamW, LAMB and the LR schedule).
// Plain data with defaults; the YAML layer (src/config) fills and checks them.
// Nothing here parses text beyond the enum spellings.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace dtrain {

enum class OptimizerName : uint8_t { sgd, adamw, lamb };
inline constexpr std::pair<OptimizerName, std::string_view> kOptimizerNames[] = {
    {OptimizerName::sgd, "sgd"}, {OptimizerName::adamw, "adamw"}, {OptimizerName::lamb, "lamb"}};
inline std::string_view to_string(OptimizerName v) {
  for (const auto& [e, s] : kOptimizerNames)
    if (e == v) return s;
  return "?";
}
inline bool from_string(std::string_view text, OptimizerName& out) {
  for (const auto& [e, s] : kOptimizerNames)
    if (s == text) {
      out = e;
      return true;
    }
  return false;
}
inline const auto& enum_names(OptimizerName) { return kOptimizerNames; }

enum class ScheduleName : uint8_t { constant, step, cosine, linear };
inline constexpr std::pair<ScheduleName, std::string_view> kScheduleNames[] = {
    {ScheduleName::constant, "constant"},
    {ScheduleName::step, "step"},
    {ScheduleName::cosine, "cosine"},
    {ScheduleName::linear, "linear"}};
inline std::string_view to_string(ScheduleName v) {
  for (const auto& [e, s] : kScheduleNames)
    if (e == v) return s;
  return "?";
}
inline bool from_string(std::string_view text, ScheduleName& out) {
  for (const auto& [e, s] : kScheduleNames)
    if (s == text) {
      out = e;
      return true;
    }
  return false;
}
inline const auto& enum_names(ScheduleName) { return kScheduleNames; }

// lr(t) = warmup ramp for t < warmup_steps, then: constant; step: lr * gamma^(t / step_size);
// cosine / linear: decay from lr to min_lr over the remaining steps.
struct ScheduleOptions {
  ScheduleName name = ScheduleName::constant;
  int64_t warmup_steps = 0;
  int64_t step_size = 1000;
  double gamma = 0.1;
  double min_lr = 0.0;
};

struct OptimizerOptions {
  OptimizerName name = OptimizerName::adamw;
  double lr = 1e-3;
  double momentum = 0.9;                       // sgd only
  bool nesterov = false;                       // sgd only
  std::array<double, 2> betas = {0.9, 0.999};  // adamw, lamb
  double eps = 1e-8;
  double weight_decay = 0.01;
  std::optional<double> clip_grad_norm;  // unset: no clipping
  ScheduleOptions schedule;
};

}  // namespace dtrain
