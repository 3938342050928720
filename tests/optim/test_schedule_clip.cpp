// LR schedules at their key steps (first, end of warm-up, first decay step, middle,
// last, past the end) and global-norm clipping (PyTorch semantics, non-finite norms,
// thread-count independence of the blocked sum).
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "optim/clip.h"
#include "optim/schedule.h"
#include "reference.h"
#include "util.h"

using namespace dtrain;
using namespace dtrain::optim;
using namespace dtrain::optim::test;

namespace {

// base 1, min 0.1, warm-up 10, 110 steps, step_size 30, gamma 0.5.
double lr(ScheduleName name, int64_t t) {
  ScheduleOptions s;
  s.name = name;
  s.warmup_steps = 10;
  s.step_size = 30;
  s.gamma = 0.5;
  s.min_lr = 0.1;
  return lr_at(s, 1.0, t, 110);
}

}  // namespace

TEST_CASE("every schedule ramps linearly from 0 over the warm-up: lr (t + 1) / w") {
  for (ScheduleName name :
       {ScheduleName::constant, ScheduleName::step, ScheduleName::cosine, ScheduleName::linear}) {
    CAPTURE(to_string(name));
    CHECK(lr(name, 0) == doctest::Approx(0.1));
    CHECK(lr(name, 4) == doctest::Approx(0.5));
    CHECK(lr(name, 9) == doctest::Approx(1.0));
    CHECK(lr(name, 10) == doctest::Approx(1.0));  // first post-warm-up step: the full lr
  }
}

TEST_CASE("constant and step schedules") {
  CHECK(lr(ScheduleName::constant, 60) == 1.0);
  CHECK(lr(ScheduleName::constant, 109) == 1.0);
  CHECK(lr(ScheduleName::step, 29) == 1.0);
  CHECK(lr(ScheduleName::step, 30) == 0.5);
  CHECK(lr(ScheduleName::step, 60) == 0.25);
  CHECK(lr(ScheduleName::step, 109) == 0.125);  // floor(109 / 30) = 3
}

TEST_CASE("cosine and linear decay to min_lr") {
  // mid: p = (60 - 10) / 100 = 0.5.
  CHECK(lr(ScheduleName::cosine, 60) == doctest::Approx(0.55));
  CHECK(lr(ScheduleName::linear, 60) == doctest::Approx(0.55));
  CHECK(lr(ScheduleName::cosine, 35) ==
        doctest::Approx(0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.25))));
  // last step: p = 99 / 100, still just above min_lr.
  CHECK(lr(ScheduleName::cosine, 109) == doctest::Approx(0.10022204783542078));
  CHECK(lr(ScheduleName::linear, 109) == doctest::Approx(0.109));
  CHECK(lr(ScheduleName::cosine, 110) == doctest::Approx(0.1));
  CHECK(lr(ScheduleName::linear, 500) == doctest::Approx(0.1));
}

TEST_CASE("no warm-up starts at the full lr, and a run within its warm-up ends on min_lr") {
  ScheduleOptions s;
  s.name = ScheduleName::linear;
  CHECK(lr_at(s, 0.3, 0, 100) == 0.3);
  s.warmup_steps = 100;
  CHECK(lr_at(s, 0.3, 99, 100) == doctest::Approx(0.3));
  CHECK(lr_at(s, 0.3, 100, 100) == 0.0);
}

TEST_CASE("clip_grad_norm scales by max_norm / (norm + 1e-6) above max_norm only") {
  std::vector<float> g = {3, 4, 0, 0};
  Tensor gt = as_tensor(g);
  CHECK(clip_grad_norm(gt, 10.0) == doctest::Approx(5.0));
  CHECK((g[0] == 3.0f && g[1] == 4.0f));  // untouched below the threshold
  CHECK(clip_grad_norm(gt, 1.0) == doctest::Approx(5.0));
  const double c = 1.0 / (5.0 + 1e-6);
  CHECK(g[0] == static_cast<float>(3.0f * static_cast<float>(c)));
  CHECK(g[1] == doctest::Approx(4.0 * c).epsilon(1e-7));
  CHECK(std::sqrt(grad_sum_squares(gt)) == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("a non-finite norm is returned and the gradients are left alone") {
  for (float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> g = {3, 4, bad, 1};
    Tensor gt = as_tensor(g);
    const double norm = clip_grad_norm(gt, 1.0);
    CHECK_FALSE(std::isfinite(norm));
    CHECK((g[0] == 3.0f && g[1] == 4.0f && g[3] == 1.0f));
    CHECK(clip_to_norm(gt, norm, 1.0) == Clipped::no);
  }
}

TEST_CASE("the global norm is thread-count independent and matches an fp64 sum") {
  std::vector<float> g = pattern(5 * kClipBlock + 123, 9);
  double ref = 0;
  for (float x : g) ref += double(x) * x;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = grad_sum_squares(as_tensor(g));
  omp_set_num_threads(2);
  const double two = grad_sum_squares(as_tensor(g));
  omp_set_num_threads(saved);
  CHECK(std::memcmp(&one, &two, sizeof one) == 0);
  CHECK(one == doctest::Approx(ref).epsilon(1e-12));
}
