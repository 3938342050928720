// Async-signal-safe stop flag: the handler stores the signal number in a
// lock-free atomic and returns; nothing else happens inside the handler.
#include "runtime/signals.h"

#include <atomic>
#include <csignal>

#include "core/error.h"

namespace dtrain::runtime {

namespace {
std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free);

struct sigaction g_old_int, g_old_term, g_old_usr1;

extern "C" void on_stop_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

void install(int sig, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  DTRAIN_CHECK(sigaction(sig, &sa, old) == 0, "sigaction({}) failed", sig);
}
}  // namespace

StopSignals::StopSignals() {
  DTRAIN_CHECK(!g_installed.exchange(true), "StopSignals installed twice");
  g_signal.store(0);
  install(SIGINT, &g_old_int);
  install(SIGTERM, &g_old_term);
  install(SIGUSR1, &g_old_usr1);
}

StopSignals::~StopSignals() {
  g_installed.store(false);
  // After a stop the process is on its way out (exit 4, MPI_Finalize): a second
  // notice, e.g. SLURM signalling every task and the launcher again, must not kill
  // it there, so the recording handlers stay.
  if (requested()) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
}

bool StopSignals::requested() const { return g_signal.load(std::memory_order_relaxed) != 0; }
int StopSignals::signal() const { return g_signal.load(std::memory_order_relaxed); }

}  // namespace dtrain::runtime
