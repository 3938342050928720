// The loss scaler's state machine (see loss_scaler.h for the specification).
#include "precision/loss_scaler.h"

#include <algorithm>

namespace dtrain::precision {

LossScaler::LossScaler(const LossScaleOptions& options) : options_(options) {
  state_.scale = options_.mode == LossScaleMode::none ? 1.0 : options_.init;
  state_.overflows_left = std::max<int64_t>(options_.hysteresis, 1);
}

ScaleDecision LossScaler::update(bool found_inf) {
  ScaleDecision d;
  d.old_scale = d.new_scale = state_.scale;
  const int64_t budget = std::max<int64_t>(options_.hysteresis, 1);
  if (!found_inf) {
    if (options_.mode != LossScaleMode::dynamic) return d;
    if (++state_.clean_steps >= options_.growth_interval) {
      state_.clean_steps = 0;
      state_.overflows_left = budget;
      const double grown = std::min(options_.max, state_.scale * options_.growth_factor);
      if (grown != state_.scale) {
        state_.scale = grown;
        d.event = ScaleEvent::grew;
      }
    }
    d.new_scale = state_.scale;
    return d;
  }
  if (options_.mode == LossScaleMode::none) {
    d.event = ScaleEvent::fatal;
    return d;
  }
  d.skip = true;
  if (options_.mode == LossScaleMode::static_) {
    ++state_.skipped_steps;
    return d;
  }
  state_.clean_steps = 0;
  if (--state_.overflows_left > 0) {
    d.event = ScaleEvent::tolerated;
  } else if (state_.scale > options_.min) {
    state_.scale = std::max(options_.min, state_.scale * options_.backoff_factor);
    state_.overflows_left = budget;
    d.event = ScaleEvent::backed_off;
  } else if (options_.on_min == LossScaleOnMin::error) {
    ++state_.overflows_left;  // the state is left as it was: the run ends here
    d.event = ScaleEvent::fatal;
    d.skip = false;
    return d;
  } else {
    state_.overflows_left = budget;
    d.event = ScaleEvent::at_min;
  }
  ++state_.skipped_steps;
  d.new_scale = state_.scale;
  return d;
}

void LossScaler::load(const LossScalerState& saved) {
  state_ = saved;
  if (options_.mode == LossScaleMode::none) {
    state_.scale = 1.0;
  } else if (options_.mode == LossScaleMode::static_) {
    state_.scale = options_.init;
  } else {
    state_.scale = std::clamp(state_.scale, options_.min, options_.max);
  }
  state_.overflows_left =
      std::clamp<int64_t>(state_.overflows_left, 1, std::max<int64_t>(options_.hysteresis, 1));
}

}  // namespace dtrain::precision
