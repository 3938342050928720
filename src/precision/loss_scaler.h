// The loss scaler: one state machine, written down here and in docs/precision.md,
// and tested from a table of (overflow / clean) step sequences.
//
// Each step the trainer multiplies the loss (the backward seed) by scale(), sums
// the gradients over micro-batches and ranks, and asks whether any element of the
// summed gradient is inf or nan (found_inf: the sum carries one rank's inf to every
// rank, so every rank decides the same). update(found_inf) then says whether to
// skip the optimizer step and what the scale becomes:
//
//   mode none     scale 1. An overflow is fatal: the caller exits 3 naming the step
//                 and the first parameter whose gradient is not finite.
//   mode static   scale = init. An overflow skips the step; the scale stays.
//   mode dynamic  scale starts at init.
//     overflow:   skip the step; the clean-step count restarts at 0; one overflow is
//                 taken from the hysteresis budget (hysteresis, default 1). While the
//                 budget is not empty the scale stays (event tolerated). When it
//                 empties: at scale > min, scale = max(min, scale x backoff_factor)
//                 (backed_off) and the budget refills; already at min, on_min: error
//                 makes it fatal (exit 3), on_min: clamp stays at min (at_min) and
//                 refills the budget.
//     clean:      the count grows by one; at growth_interval the scale becomes
//                 min(max, scale x growth_factor) (grew, or nothing at max), the
//                 count restarts and the budget refills.
//
// A skipped step changes no weight, master or optimizer state and does not count
// as an optimizer step (the LR schedule does not advance). The state below is
// saved in checkpoints, so a resumed run continues the same sequence.
#pragma once

#include <cstdint>
#include <string>

#include "precision/options.h"

namespace dtrain::precision {

struct LossScalerState {
  double scale = 1.0;
  int64_t clean_steps = 0;     // consecutive clean steps since the last growth or overflow
  int64_t overflows_left = 1;  // hysteresis budget
  int64_t skipped_steps = 0;   // steps skipped so far (overflows)
  bool operator==(const LossScalerState&) const = default;
};

enum class ScaleEvent : uint8_t { none, grew, tolerated, backed_off, at_min, fatal };

struct ScaleDecision {
  bool skip = false;  // do not apply this step's update
  double old_scale = 1.0, new_scale = 1.0;
  ScaleEvent event = ScaleEvent::none;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options);

  LossScaleMode mode() const { return options_.mode; }
  double scale() const { return state_.scale; }
  // The step's outcome; advances the state (not on fatal, which ends the run).
  ScaleDecision update(bool found_inf);

  const LossScalerState& state() const { return state_; }
  // A saved state; its scale is clamped into [min, max] of this job's options (a
  // checkpoint may come from a job with other settings).
  void load(const LossScalerState& saved);

 private:
  LossScaleOptions options_;
  LossScalerState state_;
};

}  // namespace dtrain::precision
