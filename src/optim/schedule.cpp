// The closed forms of schedule.h, one small function per schedule.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace dtrain::optim {
namespace {

// Fraction of the post-warm-up decay done at step t, in [0, 1].
double decay_progress(int64_t t, int64_t warmup, int64_t total) {
  const int64_t span = total - warmup;
  if (span <= 0) return 1.0;
  return std::clamp(static_cast<double>(t - warmup) / static_cast<double>(span), 0.0, 1.0);
}

}  // namespace

double lr_at(const ScheduleOptions& s, double base_lr, int64_t step, int64_t total_steps) {
  DTRAIN_CHECK(step >= 0 && s.warmup_steps >= 0, "lr_at(step {}, warmup {})", step, s.warmup_steps);
  if (step < s.warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  const double p = decay_progress(step, s.warmup_steps, total_steps);
  switch (s.name) {
    case ScheduleName::constant:
      return base_lr;
    case ScheduleName::step:
      DTRAIN_CHECK(s.step_size > 0, "step schedule with step_size {}", s.step_size);
      return base_lr * std::pow(s.gamma, static_cast<double>(step / s.step_size));
    case ScheduleName::cosine:
      return s.min_lr + (base_lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    case ScheduleName::linear:
      return s.min_lr + (base_lr - s.min_lr) * (1.0 - p);
  }
  DTRAIN_CHECK(false, "unknown schedule {}", static_cast<int>(s.name));
  return base_lr;
}

}  // namespace dtrain::optim
