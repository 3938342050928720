// The collective watchdog: a thread that polls communicators' flight recorders
// (each one's oldest unfinished operation) and, when such an operation has not
// finished within the timeout — a peer rank died, exited early or hangs —
// reports it and ends this process, so no rank waits forever. It never calls
// into MPI or CUDA itself, so it cannot block behind the stuck operation.
//
// Naming the missing peer: with a heartbeat directory (the run's logs/, shared
// by the ranks), every rank's watchdog rewrites rank-N.heartbeat there on each
// poll (wall time, the world communicator's finished and oldest pending
// sequence numbers, pid, host, and whether the process is exiting). At a timeout the watchdog reads
// the others': a rank whose heartbeat went silent died or exited; a live rank that is not inside
// the stuck collective has not reached it. Without the directory (or when files are unreadable: no
// shared file system) the message says so.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"

namespace dtrain::dist {

// Exit code of a rank ended by the watchdog: the job could not run (README's 3).
inline constexpr int kExitCollectiveTimeout = 3;

class Watchdog {
 public:
  using OnTimeout = std::function<void(const std::string& message)>;
  // `world`: the group whose ranks are named. Default action: the message on
  // stderr, then _exit(kExitCollectiveTimeout) (the stuck worker thread cannot be
  // joined, so no destructor runs).
  Watchdog(const Communicator& world, double timeout_s, OnTimeout on_timeout = {},
           std::filesystem::path heartbeat_dir = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches another communicator over the same ranks too (e.g. NCCL); it must
  // outlive the watchdog. Thread-safe.
  void add(const Communicator& comm);

 private:
  struct Watched {
    const Communicator* comm;
    uint64_t seq = 0;  // its oldest pending op when last seen
    std::chrono::steady_clock::time_point since;
  };
  void watch();
  void beat();
  std::chrono::milliseconds poll() const {
    return std::chrono::milliseconds(
        std::clamp<int64_t>(static_cast<int64_t>(timeout_s_ * 1000 / 10), 10, 1000));
  }
  // A heartbeat older than this means its rank is gone.
  int64_t silent_ms() const { return std::max<int64_t>(2500, 5 * poll().count()); }
  std::string missing_peers(uint64_t stuck_seq) const;

  const Communicator& world_;
  double timeout_s_;
  OnTimeout on_timeout_;
  std::filesystem::path heartbeat_dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Watched> watched_;  // guarded by mu_
  std::thread thread_;
};

// What the watchdog says about `op` stuck for `seconds` on rank `rank`.
std::string describe_timeout(const OpRecord& op, int rank, int size, double seconds,
                             double timeout_s);

// One rank's heartbeat as written to rank-N.heartbeat.
struct Heartbeat {
  int64_t unix_ms = 0;
  uint64_t completed = 0;  // world operations finished
  uint64_t pending = 0;    // the oldest unfinished one (0: none)
  int64_t pid = 0;
  std::string host;
  bool exiting = false;  // the process is in exit() (e.g. left the loop early, in MPI_Finalize)
};
std::string format_heartbeat(const Heartbeat& h);
std::optional<Heartbeat> parse_heartbeat(const std::string& text);
// The missing-peer sentence for rank `me` stuck in world op `stuck_seq` at wall time
// `now_ms`, given every rank's heartbeat (nullopt: none readable); a rank silent for
// more than `silent_ms` counts as dead. Empty when nothing is known.
std::string describe_peers(int me, uint64_t stuck_seq, int64_t now_ms, int64_t silent_ms,
                           const std::vector<std::optional<Heartbeat>>& beats);

}  // namespace dtrain::dist
