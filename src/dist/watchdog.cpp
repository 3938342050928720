// Polls the oldest pending operation of each watched communicator a few times a
// second; the clock restarts whenever a different operation becomes the oldest.
#include "dist/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dtrain::dist {

namespace {

// Set by an atexit handler registered after MPI's, so it runs before MPI_Finalize:
// a rank that called exit() says so in its heartbeat while it waits there.
std::atomic<bool> g_exiting{false};

void mark_exiting() { g_exiting = true; }

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::filesystem::path heartbeat_path(const std::filesystem::path& dir, int rank) {
  return dir / fmt::format("rank-{}.heartbeat", rank);
}

}  // namespace

std::string describe_timeout(const OpRecord& op, int rank, int size, double seconds,
                             double timeout_s) {
  return fmt::format(
      "collective #{} {} of {} bytes has not finished after {:.0f} s (comm.timeout_s = {}) on "
      "rank {} of {}: another rank died, exited early or hangs before reaching it; see the "
      "other ranks' messages and logs/rank-N.log",
      op.seq, op.op, op.bytes, seconds, timeout_s, rank, size);
}

std::string format_heartbeat(const Heartbeat& h) {
  return fmt::format("{} {} {} {} {} {}\n", h.unix_ms, h.completed, h.pending, h.pid, h.host,
                     h.exiting ? "exiting" : "running");
}

std::optional<Heartbeat> parse_heartbeat(const std::string& text) {
  std::istringstream in(text);
  Heartbeat h;
  std::string state;
  if (!(in >> h.unix_ms >> h.completed >> h.pending >> h.pid >> h.host >> state)) {
    return std::nullopt;
  }
  if (state != "running" && state != "exiting") return std::nullopt;
  h.exiting = state == "exiting";
  return h;
}

std::string describe_peers(int me, uint64_t stuck_seq, int64_t now_ms, int64_t silent_ms,
                           const std::vector<std::optional<Heartbeat>>& beats) {
  std::vector<std::string> dead, behind, unknown;
  for (int r = 0; r < static_cast<int>(beats.size()); ++r) {
    if (r == me) continue;
    const std::optional<Heartbeat>& b = beats[static_cast<size_t>(r)];
    if (!b) {
      unknown.push_back(std::to_string(r));
      continue;
    }
    const int64_t age = now_ms - b->unix_ms;
    if (age > silent_ms) {
      dead.push_back(fmt::format("rank {} (pid {} on {}) silent for {:.0f} s: it died or exited", r,
                                 b->pid, b->host, static_cast<double>(age) / 1000.0));
    } else if (b->exiting) {
      behind.push_back(
          fmt::format("rank {} (pid {} on {}) is exiting without reaching it (last "
                      "finished #{})",
                      r, b->pid, b->host, b->completed));
    } else if (b->pending != stuck_seq && b->completed < stuck_seq) {
      const std::string where = b->pending != 0 ? fmt::format(", waiting in #{}", b->pending)
                                                : std::string(", outside any collective");
      behind.push_back(fmt::format(
          "rank {} (pid {} on {}) is alive but has not reached it (last finished #{}{})", r, b->pid,
          b->host, b->completed, where));
    }
  }
  std::vector<std::string> parts = dead;
  parts.insert(parts.end(), behind.begin(), behind.end());
  if (parts.empty()) {
    if (unknown.size() + 1 == beats.size()) return {};
    if (unknown.empty()) return {};
    return fmt::format("no heartbeat from rank(s) {}", fmt::join(unknown, ", "));
  }
  return fmt::format("missing peer: {}", fmt::join(parts, "; "));
}

Watchdog::Watchdog(const Communicator& world, double timeout_s, OnTimeout on_timeout,
                   std::filesystem::path heartbeat_dir)
    : world_(world),
      timeout_s_(timeout_s),
      on_timeout_(std::move(on_timeout)),
      heartbeat_dir_(std::move(heartbeat_dir)) {
  if (!on_timeout_) {
    on_timeout_ = [](const std::string& message) {
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
      _exit(kExitCollectiveTimeout);
    };
  }
  watched_.push_back({&world_, 0, std::chrono::steady_clock::now()});
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(mark_exiting); });
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (!heartbeat_dir_.empty()) {  // a rank that ended normally leaves no heartbeat behind
    std::error_code ec;
    std::filesystem::remove(heartbeat_path(heartbeat_dir_, world_.rank()), ec);
  }
}

void Watchdog::add(const Communicator& comm) {
  std::lock_guard lock(mu_);
  watched_.push_back({&comm, 0, std::chrono::steady_clock::now()});
}

// This rank's heartbeat: written to a temporary and renamed, so readers see whole files.
void Watchdog::beat() {
  if (heartbeat_dir_.empty()) return;
  Heartbeat h;
  h.unix_ms = unix_ms();
  h.completed = world_.stats().completed;
  h.pending = world_.oldest_pending().seq;
  h.pid = getpid();
  h.host = host_name();
  h.exiting = g_exiting.load();
  const std::filesystem::path path = heartbeat_path(heartbeat_dir_, world_.rank());
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << format_heartbeat(h);
    if (!out) return;  // a full or read-only disk: the heartbeat is a diagnostic only
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
}

std::string Watchdog::missing_peers(uint64_t stuck_seq) const {
  if (heartbeat_dir_.empty()) return {};
  std::vector<std::optional<Heartbeat>> beats;
  for (int r = 0; r < world_.size(); ++r) {
    std::ifstream in(heartbeat_path(heartbeat_dir_, r));
    std::stringstream text;
    text << in.rdbuf();
    beats.push_back(in.is_open() ? parse_heartbeat(text.str()) : std::nullopt);
  }
  return describe_peers(world_.rank(), stuck_seq, unix_ms(), silent_ms(), beats);
}

void Watchdog::watch() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, poll(), [this] { return stop_; })) {
    beat();
    for (Watched& w : watched_) {
      const OpRecord op = w.comm->oldest_pending();
      if (op.seq != w.seq) {
        w.seq = op.seq;
        w.since = Clock::now();
        continue;
      }
      if (op.seq == 0) continue;
      const double waited = std::chrono::duration<double>(Clock::now() - w.since).count();
      if (waited < timeout_s_) continue;
      const std::string prefix = world_.size() > 1
                                     ? fmt::format("dtrain[rank {}]: error: ", world_.rank())
                                     : std::string("dtrain: error: ");
      std::string message =
          prefix + describe_timeout(op, world_.rank(), world_.size(), waited, timeout_s_);
      if (w.comm != &world_) message += fmt::format(" (on the {} communicator)", w.comm->backend());
      // The world's sequence numbers are the ones in the heartbeats.
      const uint64_t stuck = w.comm == &world_ ? op.seq : world_.oldest_pending().seq;
      const std::string peers = missing_peers(stuck != 0 ? stuck : world_.stats().completed + 1);
      if (!peers.empty()) message += "; " + peers;
      on_timeout_(message);
      w.seq = 0;  // a test's action returns: watch afresh
    }
  }
}

}  // namespace dtrain::dist
