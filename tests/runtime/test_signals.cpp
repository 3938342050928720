// StopSignals: a stop signal is recorded, not fatal; once a stop was requested the
// handlers stay after the object is gone, so a second notice while the process
// exits (SLURM signals every task, then the launcher again) cannot kill it.
#include <doctest/doctest.h>

#include <csignal>

#include "runtime/signals.h"

using dtrain::runtime::StopSignals;

TEST_CASE("stop signals: recorded, and a late second one after the stop is harmless") {
  {
    StopSignals signals;
    CHECK(!signals.requested());
    std::raise(SIGUSR1);
    CHECK(signals.requested());
    CHECK(signals.signal() == SIGUSR1);
  }
  std::raise(SIGUSR1);  // the default action would end this test binary
  std::raise(SIGTERM);
  StopSignals again;  // a new instance starts clear
  CHECK(!again.requested());
}
