// Graceful stop on SIGINT, SIGTERM (also SLURM's preemption notice) and
// SIGUSR1: the handler only records the signal; the trainer polls it at each
// step boundary, writes a checkpoint and exits with kExitInterrupted.
#pragma once

namespace dtrain::runtime {

// Exit code of a run stopped by a signal after its checkpoint was saved (README).
inline constexpr int kExitInterrupted = 4;

class StopSignals {
 public:
  StopSignals();   // installs the handlers (a second instance is an internal error)
  ~StopSignals();  // restores the previous handlers, unless a stop was requested
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  bool requested() const;  // a stop signal arrived
  int signal() const;      // which one (0 if none)
};

}  // namespace dtrain::runtime
