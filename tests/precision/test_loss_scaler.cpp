// The loss scaler against its specification (precision/loss_scaler.h): each row is
// a sequence of steps ('x' overflow, '.' clean) and the expected scale, skip and
// event after every step, plus the skipped-step count at the end.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "precision/loss_scaler.h"

using namespace dtrain;
using namespace dtrain::precision;

namespace {

struct Row {
  const char* name;
  LossScaleOptions options;
  std::string steps;               // 'x' overflow, '.' clean
  std::vector<double> scales;      // after each step
  std::string skips;               // 's' skipped, '-' applied
  std::vector<ScaleEvent> events;  // per step
  int64_t skipped = 0;
};

LossScaleOptions dynamic(double init, int64_t interval, int64_t hysteresis = 1,
                         LossScaleOnMin on_min = LossScaleOnMin::error, double min = 1.0,
                         double max = 16777216.0) {
  LossScaleOptions o;
  o.mode = LossScaleMode::dynamic;
  o.init = init;
  o.growth_interval = interval;
  o.hysteresis = hysteresis;
  o.on_min = on_min;
  o.min = min;
  o.max = max;
  return o;
}

LossScaleOptions fixed(LossScaleMode mode, double init) {
  LossScaleOptions o;
  o.mode = mode;
  o.init = init;
  return o;
}

constexpr ScaleEvent N = ScaleEvent::none, G = ScaleEvent::grew, T = ScaleEvent::tolerated,
                     B = ScaleEvent::backed_off, M = ScaleEvent::at_min, F = ScaleEvent::fatal;

}  // namespace

TEST_CASE("loss scaler: the specification as a table of step sequences") {
  const std::vector<Row> rows = {
      {"clean steps grow the scale every growth_interval",
       dynamic(8, 2),
       "......",
       {8, 16, 16, 32, 32, 64},
       "------",
       {N, G, N, G, N, G},
       0},
      {"an overflow halves, skips and restarts the clean count",
       dynamic(8, 2),
       ".x..x.",
       {8, 4, 4, 8, 4, 4},
       "-s--s-",
       {N, B, N, G, B, N},
       2},
      {"growth stops at max",
       dynamic(8, 1, 1, LossScaleOnMin::error, 1, 16),
       "...",
       {16, 16, 16},
       "---",
       {G, N, N},
       0},
      {"backoff stops at min; another overflow there is fatal",
       dynamic(4, 100, 1, LossScaleOnMin::error, 1),
       "xxx",
       {2, 1, 1},
       "ss-",
       {B, B, F},
       2},
      {"on_min clamp stays at min and keeps skipping",
       dynamic(2, 100, 1, LossScaleOnMin::clamp, 1),
       "xxx.",
       {1, 1, 1, 1},
       "sss-",
       {B, M, M, N},
       3},
      {"hysteresis 2 tolerates one overflow before backing off",
       dynamic(8, 100, 2),
       "xxxx",
       {8, 4, 4, 2},
       "ssss",
       {T, B, T, B},
       4},
      {"clean steps between overflows do not refill the budget; growth does",
       dynamic(8, 3, 2),
       "x..x...x",
       {8, 8, 8, 4, 4, 4, 8, 8},
       "s--s---s",
       {T, N, N, B, N, N, G, T},
       3},
      {"static: overflow skips, the scale never moves",
       fixed(LossScaleMode::static_, 128),
       ".x.x",
       {128, 128, 128, 128},
       "-s-s",
       {N, N, N, N},
       2},
      {"none: scale 1, an overflow is fatal",
       fixed(LossScaleMode::none, 128),
       "..x",
       {1, 1, 1},
       "---",
       {N, N, F},
       0},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    LossScaler scaler(row.options);
    REQUIRE(row.scales.size() == row.steps.size());
    for (size_t i = 0; i < row.steps.size(); ++i) {
      CAPTURE(i);
      const double before = scaler.scale();
      const ScaleDecision d = scaler.update(row.steps[i] == 'x');
      CHECK(d.old_scale == before);
      CHECK(d.skip == (row.skips[i] == 's'));
      CHECK(d.event == row.events[i]);
      if (d.event == ScaleEvent::fatal) {
        CHECK(scaler.scale() == before);  // the state is as it was: the run ends
        break;
      }
      CHECK(d.new_scale == row.scales[i]);
      CHECK(scaler.scale() == row.scales[i]);
    }
    CHECK(scaler.state().skipped_steps == row.skipped);
  }
}

TEST_CASE("loss scaler: a saved state continues the same sequence") {
  const LossScaleOptions o = dynamic(64, 3, 2);
  LossScaler whole(o), first(o);
  const std::string steps = "x..x..x....x.";
  for (size_t i = 0; i < 6; ++i) {
    whole.update(steps[i] == 'x');
    first.update(steps[i] == 'x');
  }
  LossScaler second(o);
  second.load(first.state());
  CHECK(second.state() == whole.state());
  for (size_t i = 6; i < steps.size(); ++i) {
    const ScaleDecision a = whole.update(steps[i] == 'x');
    const ScaleDecision b = second.update(steps[i] == 'x');
    CHECK(a.new_scale == b.new_scale);
    CHECK(a.skip == b.skip);
  }
  CHECK(second.state() == whole.state());
}

TEST_CASE("loss scaler: a loaded state fits this job's settings") {
  LossScalerState saved;
  saved.scale = 1 << 20;
  saved.overflows_left = 5;
  saved.skipped_steps = 7;
  LossScaler dyn(dynamic(8, 10, 2, LossScaleOnMin::error, 1, 1024));
  dyn.load(saved);
  CHECK(dyn.scale() == 1024);  // clamped to max
  CHECK(dyn.state().overflows_left == 2);
  CHECK(dyn.state().skipped_steps == 7);
  LossScaler none(fixed(LossScaleMode::none, 8));
  none.load(saved);
  CHECK(none.scale() == 1.0);  // a scaled checkpoint resumed without scaling
  LossScaler stat(fixed(LossScaleMode::static_, 8));
  stat.load(saved);
  CHECK(stat.scale() == 8.0);
}
