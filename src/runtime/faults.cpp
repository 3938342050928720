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

SaveFaultInjector::SaveFaultInjector(int rank) {
  const char* spec = std::getenv("DTRAIN_TEST_SAVE_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  int r = -1;
  long long step = -1;
  char phase[16] = {};
  const std::string p = std::sscanf(spec, "%d:%lld:%15s", &r, &step, phase) == 3 ? phase : "";
  if (step < 0 ||
      (p != "shard" && p != "written" && p != "manifest" && p != "renamed" && p != "diverge")) {
    throw Error(fmt::format("DTRAIN_TEST_SAVE_FAULT={} is not <rank>:<step>:<phase>", spec),
                "phases: shard, written, manifest, renamed, diverge; or unset it");
  }
  if (r != rank) return;
  step_ = step;
  phase_ = p;
}

void SaveFaultInjector::at(int64_t step, std::string_view phase) const {
  if (step != step_ || phase != phase_) return;
  std::fprintf(stderr,
               "dtrain: DTRAIN_TEST_SAVE_FAULT: ending this rank in the save of step %lld "
               "(%s)\n",
               static_cast<long long>(step), phase_.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

OverflowInjector::OverflowInjector(int rank) {
  const char* spec = std::getenv("DTRAIN_TEST_OVERFLOW");
  if (spec == nullptr || *spec == '\0') return;
  const std::string text = spec;
  const size_t colon = text.find(':');
  const auto bad = [&] {
    return Error(fmt::format("DTRAIN_TEST_OVERFLOW={} is not <rank|*>:<step>[,<step>...]", text),
                 "e.g. DTRAIN_TEST_OVERFLOW='*:3,5' or 1:4; or unset it");
  };
  if (colon == std::string::npos || colon == 0) throw bad();
  const std::string who = text.substr(0, colon);
  int r = -1;
  if (who != "*") {
    char* end = nullptr;
    r = static_cast<int>(std::strtol(who.c_str(), &end, 10));
    if (*end != '\0' || r < 0) throw bad();
  }
  std::vector<int64_t> steps;
  for (size_t at = colon + 1; at <= text.size();) {
    size_t next = text.find(',', at);
    if (next == std::string::npos) next = text.size();
    const std::string item = text.substr(at, next - at);
    char* end = nullptr;
    const long long step = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || step <= 0) throw bad();
    steps.push_back(step);
    at = next + 1;
  }
  if (who == "*" || r == rank) steps_ = std::move(steps);
}

bool OverflowInjector::due(int64_t step) const {
  for (int64_t s : steps_) {
    if (s == step) return true;
  }
  return false;
}

}  // namespace dtrain::runtime
