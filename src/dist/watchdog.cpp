// Polls the oldest pending operation a few times a second; the clock restarts
// whenever a different operation becomes the oldest.
#include "dist/watchdog.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"

namespace dtrain::dist {

std::string describe_timeout(const OpRecord& op, int rank, int size, double seconds,
                             double timeout_s) {
  return fmt::format(
      "collective #{} {} of {} bytes has not finished after {:.0f} s (comm.timeout_s = {}) on "
      "rank {} of {}: another rank died, exited early or hangs before reaching it; see the "
      "other ranks' messages and logs/rank-N.log",
      op.seq, op.op, op.bytes, seconds, timeout_s, rank, size);
}

Watchdog::Watchdog(const Communicator& comm, double timeout_s, OnTimeout on_timeout)
    : comm_(comm), timeout_s_(timeout_s), on_timeout_(std::move(on_timeout)) {
  if (!on_timeout_) {
    on_timeout_ = [](const std::string& message) {
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
      _exit(kExitCollectiveTimeout);
    };
  }
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::watch() {
  using Clock = std::chrono::steady_clock;
  const auto poll = std::chrono::milliseconds(
      std::clamp<int64_t>(static_cast<int64_t>(timeout_s_ * 1000 / 10), 10, 1000));
  uint64_t watched = 0;  // seq of the oldest pending op when last seen
  Clock::time_point since = Clock::now();
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, poll, [this] { return stop_; })) {
    const OpRecord op = comm_.oldest_pending();
    if (op.seq != watched) {
      watched = op.seq;
      since = Clock::now();
      continue;
    }
    if (op.seq == 0) continue;
    const double waited = std::chrono::duration<double>(Clock::now() - since).count();
    if (waited >= timeout_s_) {
      const std::string prefix = comm_.size() > 1
                                     ? fmt::format("dtrain[rank {}]: error: ", comm_.rank())
                                     : std::string("dtrain: error: ");
      on_timeout_(prefix + describe_timeout(op, comm_.rank(), comm_.size(), waited, timeout_s_));
      watched = 0;  // a test's action returns: watch afresh
    }
  }
}

}  // namespace dtrain::dist
