// Async-signal-safe stop flag: the handler stores the signal number in a
// lock-free atomic and returns; nothing else happens inside the handler. The fatal
// signals' reporter writes one line with write() alone, then hands the signal on.
#include "runtime/signals.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <iterator>

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

namespace {

constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_old_fatal[std::size(kFatal)];
std::atomic<int64_t> g_steps{0};
static_assert(std::atomic<int64_t>::is_always_lock_free);
char g_who[96];  // written once, before the handlers go in
std::atomic<bool> g_reporting{false};

// Async-signal-safe: write() of pieces built without allocation.
void put(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void put_number(int64_t v) {
  char buf[24];
  char* p = buf + sizeof(buf);
  *--p = '\0';
  const bool negative = v < 0;
  uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  do {
    *--p = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (negative) *--p = '-';
  put(p);
}

const char* fatal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV, a segmentation fault";
    case SIGBUS:
      return "SIGBUS, a bus error";
    case SIGFPE:
      return "SIGFPE, an arithmetic exception";
    case SIGILL:
      return "SIGILL, an illegal instruction";
    case SIGABRT:
      return "SIGABRT, aborted";
    default:
      return "a fatal signal";
  }
}

extern "C" void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  if (!g_reporting.exchange(true)) {  // once, whichever thread faults first
    put(g_who);
    put(": ended by signal ");
    put_number(sig);
    put(" (");
    put(fatal_name(sig));
    put(") with ");
    put_number(g_steps.load(std::memory_order_relaxed));
    put(" step(s) done\n");
  }
  size_t k = 0;
  while (k < std::size(kFatal) && kFatal[k] != sig) ++k;
  if (k < std::size(kFatal)) {
    const struct sigaction& old = g_old_fatal[k];
    if ((old.sa_flags & SA_SIGINFO) != 0 && old.sa_sigaction != nullptr) {
      old.sa_sigaction(sig, info, context);
    } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN &&
               old.sa_handler != nullptr) {
      old.sa_handler(sig);
    }
  }
  // The default action, once this handler returns (the signal is blocked until then).
  signal(sig, SIG_DFL);
  raise(sig);
}

std::atomic<bool> g_fatal_installed{false};

}  // namespace

void report_fatal_signals(const std::string& who) {
  if (g_fatal_installed.exchange(true)) return;
  const size_t n = std::min(who.size(), sizeof(g_who) - 1);
  who.copy(g_who, n);
  g_who[n] = '\0';
  for (size_t k = 0; k < std::size(kFatal); ++k) {
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    DTRAIN_CHECK(sigaction(kFatal[k], &sa, &g_old_fatal[k]) == 0, "sigaction({}) failed",
                 kFatal[k]);
  }
}

void note_steps_done(int64_t steps) { g_steps.store(steps, std::memory_order_relaxed); }

bool StopSignals::requested() const { return g_signal.load(std::memory_order_relaxed) != 0; }
int StopSignals::signal() const { return g_signal.load(std::memory_order_relaxed); }

}  // namespace dtrain::runtime
