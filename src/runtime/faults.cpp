// DTRAIN_TEST_FAULT parsing and the five ways to die.
#include "runtime/faults.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace dtrain::runtime {

FaultInjector::FaultInjector(int rank) {
  const char* spec = std::getenv("DTRAIN_TEST_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  int r = -1;
  long long step = -1;
  char mode[16] = {};
  if (std::sscanf(spec, "%d:%lld:%15s", &r, &step, mode) != 3 || step < 0) {
    throw Error(fmt::format("DTRAIN_TEST_FAULT={} is not <rank>:<step>:<mode>", spec),
                "modes: exit0, exit1, abort, kill, hang; or unset it");
  }
  const std::string m = mode;
  const Mode parsed = m == "exit0"   ? Mode::exit0
                      : m == "exit1" ? Mode::exit1
                      : m == "abort" ? Mode::abort
                      : m == "kill"  ? Mode::kill
                      : m == "hang"  ? Mode::hang
                                     : Mode::none;
  if (parsed == Mode::none) {
    throw Error(fmt::format("DTRAIN_TEST_FAULT: unknown mode {}", m),
                "modes: exit0, exit1, abort, kill, hang");
  }
  if (r != rank) return;
  mode_ = parsed;
  step_ = step;
}

void FaultInjector::after_step(int64_t step) const {
  if (mode_ == Mode::none || step != step_) return;
  std::fprintf(stderr, "dtrain: DTRAIN_TEST_FAULT: ending this rank after step %lld\n",
               static_cast<long long>(step));
  std::fflush(stderr);
  switch (mode_) {
    case Mode::exit0:
      std::exit(0);
    case Mode::exit1:
      std::exit(1);
    case Mode::abort:
      std::abort();
    case Mode::kill:
      kill(getpid(), SIGKILL);
      break;
    case Mode::hang:
      for (;;) pause();
    case Mode::none:
      break;
  }
}

}  // namespace dtrain::runtime
