// Graceful stop on SIGINT, SIGTERM (also SLURM's preemption notice) and
// SIGUSR1: the handler only records the signal; the trainer polls it at each
// step boundary, writes a checkpoint and exits with kExitInterrupted.
#pragma once

#include <cstdint>
#include <string>

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

// A rank that a fatal signal ends (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) says so on
// stderr before it dies, naming itself and how many steps it had done: under
// `dtrain train --nproc` mpirun's own report is off, and on a cluster its report names a
// host and a pid, not the rank. `who` is the prefix of the line ("dtrain[rank 1]"); the
// handlers that were there before (Open MPI's backtrace) still run after the line, then
// the signal's default action. Install after MPI starts (it installs its own). Idempotent.
void report_fatal_signals(const std::string& who);
// The steps done so far, for that line (the trainer calls it after each step).
void note_steps_done(int64_t steps);

}  // namespace dtrain::runtime
