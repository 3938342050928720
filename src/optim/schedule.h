// Learning-rate schedules as one pure function of the step: no state, so a resumed
// run only needs the step count. Warm-up is a linear ramp from 0 in front of every
// schedule. Does not know about optimizers or the trainer loop.
#pragma once

#include <cstdint>

#include "optim/options.h"

namespace dtrain::optim {

// The lr for optimizer step t (counted from 0) of a run of total_steps steps:
//   t < w (w = warmup_steps):  base_lr * (t + 1) / w   (step w-1 already uses base_lr)
//   constant:                  base_lr
//   step:                      base_lr * gamma^floor(t / step_size)  (t from 0, w included)
//   cosine:  min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2
//   linear:  min_lr + (base_lr - min_lr) * (1 - p)
// with p = clamp((t - w) / (total_steps - w), 0, 1): the decay ends at t = total_steps,
// so the last step (total_steps - 1) is still just above min_lr (as HF and llm.c do);
// steps at or past total_steps, or a run no longer than its warm-up, get min_lr.
double lr_at(const ScheduleOptions& schedule, double base_lr, int64_t step, int64_t total_steps);

}  // namespace dtrain::optim
