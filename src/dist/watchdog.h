// The collective watchdog: a thread that polls one communicator's flight recorder
// (its oldest unfinished operation) and, when that operation has not finished
// within the timeout — a peer rank died, exited early or hangs — reports it and
// ends this process, so no rank waits forever. It never calls into MPI or CUDA
// itself, so it cannot block behind the stuck operation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "dist/communicator.h"

namespace dtrain::dist {

// Exit code of a rank ended by the watchdog: the job could not run (README's 3).
inline constexpr int kExitCollectiveTimeout = 3;

class Watchdog {
 public:
  using OnTimeout = std::function<void(const std::string& message)>;
  // Default action: the message on stderr, then _exit(kExitCollectiveTimeout) (the
  // stuck worker thread cannot be joined, so no destructor runs).
  Watchdog(const Communicator& comm, double timeout_s, OnTimeout on_timeout = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch();

  const Communicator& comm_;
  double timeout_s_;
  OnTimeout on_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// What the watchdog says about `op` stuck for `seconds` on rank `rank`.
std::string describe_timeout(const OpRecord& op, int rank, int size, double seconds,
                             double timeout_s);

}  // namespace dtrain::dist
