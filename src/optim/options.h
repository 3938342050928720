// Typed options of the optimizer module (SGD, AdamW, LAMB and the LR schedule).
// Plain data with defaults; the YAML layer (src/config) fills and checks them.
// Nothing here parses text beyond the enum spellings.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/enum_names.h"

namespace dtrain {

enum class OptimizerName : uint8_t { sgd, adamw, lamb };
inline constexpr std::pair<OptimizerName, std::string_view> kOptimizerNames[] = {
    {OptimizerName::sgd, "sgd"}, {OptimizerName::adamw, "adamw"}, {OptimizerName::lamb, "lamb"}};
inline std::string_view to_string(OptimizerName v) { return enum_name(kOptimizerNames, v); }
inline bool from_string(std::string_view text, OptimizerName& out) {
  return enum_parse(kOptimizerNames, text, out);
}
inline const auto& enum_names(OptimizerName) { return kOptimizerNames; }

enum class ScheduleName : uint8_t { constant, step, cosine, linear };
inline constexpr std::pair<ScheduleName, std::string_view> kScheduleNames[] = {
    {ScheduleName::constant, "constant"},
    {ScheduleName::step, "step"},
    {ScheduleName::cosine, "cosine"},
    {ScheduleName::linear, "linear"}};
inline std::string_view to_string(ScheduleName v) { return enum_name(kScheduleNames, v); }
inline bool from_string(std::string_view text, ScheduleName& out) {
  return enum_parse(kScheduleNames, text, out);
}
inline const auto& enum_names(ScheduleName) { return kScheduleNames; }

// Which parameter groups weight decay leaves out. The runtime maps each FlatStore
// entry's group to a DecayMode (optim/segments.h): weights always decay; biases and
// norm scales/shifts decay only under `none`; embeddings decay except under
// `norm_bias_embedding`. The default is the BERT / GPT-2 recipe.
enum class NoDecayGroups : uint8_t { none, norm_and_bias, norm_bias_embedding };
inline constexpr std::pair<NoDecayGroups, std::string_view> kNoDecayGroupsNames[] = {
    {NoDecayGroups::none, "none"},
    {NoDecayGroups::norm_and_bias, "norm_and_bias"},
    {NoDecayGroups::norm_bias_embedding, "norm_bias_embedding"}};
inline std::string_view to_string(NoDecayGroups v) { return enum_name(kNoDecayGroupsNames, v); }
inline bool from_string(std::string_view text, NoDecayGroups& out) {
  return enum_parse(kNoDecayGroupsNames, text, out);
}
inline const auto& enum_names(NoDecayGroups) { return kNoDecayGroupsNames; }

// lr(t) = lr * (t + 1) / warmup_steps for t < warmup_steps, then: constant: lr;
// step: lr * gamma^floor(t / step_size) (t counted from 0, warm-up included);
// cosine / linear: from lr to min_lr as p = (t - warmup) / (total - warmup) goes 0 -> 1
// (min_lr is reached at t = total, one past the last step). See optim/schedule.h.
struct ScheduleOptions {
  ScheduleName name = ScheduleName::constant;
  int64_t warmup_steps = 0;
  int64_t step_size = 1000;
  double gamma = 0.1;
  double min_lr = 0.0;
};

// optimizer.ema: an exponential moving average of the weights, kept beside them as an
// optimizer state buffer ("ema", f32, the parameters' layout) and updated after every
// step: ema += (1 - d) (p - ema), with d = decay, or with warmup
// min(decay, (1 + t) / (10 + t)) at step t (counted from 1), so that the average does
// not dwell on the initial weights (t is the optimizer's step count: an average switched
// on at a resume ramps from that step). It starts as the weights once they are set
// (Optimizer::start_ema).
struct EmaOptions {
  std::optional<double> decay;  // unset: no average
  bool warmup = true;
};

struct OptimizerOptions {
  OptimizerName name = OptimizerName::adamw;
  double lr = 1e-3;
  double momentum = 0.9;                       // sgd only
  bool nesterov = false;                       // sgd only
  std::array<double, 2> betas = {0.9, 0.999};  // adamw, lamb
  double eps = 1e-8;
  double weight_decay = 0.01;
  NoDecayGroups no_decay = NoDecayGroups::norm_and_bias;
  std::optional<double> clip_grad_norm;  // unset: no clipping
  ScheduleOptions schedule;
  EmaOptions ema;
  // Fine-tuning (runtime/param_groups.h): parameters matching a `freeze` pattern keep
  // their values (their gradients are zeroed, the optimizer passes them over);
  // `layer_decay` d scales the learning rate of layer l (0: before the first block, the
  // embeddings; 1..L: the model's blocks; L + 1: after them, the head) by d^(L + 1 - l).
  std::vector<std::string> freeze;
  std::optional<double> layer_decay;  // unset: every layer at optimizer.lr
  // optimizer.groups (PyTorch's parameter groups): the parameters a group's patterns
  // match (as freeze's) take its learning-rate factor (times layer_decay's) and its
  // weight decay (in place of weight_decay and no_decay); the first group that matches
  // a parameter decides it.
  struct Group {
    std::vector<std::string> params;
    std::optional<double> lr_scale;      // unset: 1
    std::optional<double> weight_decay;  // unset: weight_decay and no_decay as usual
  };
  std::vector<Group> groups;
};

}  // namespace dtrain
