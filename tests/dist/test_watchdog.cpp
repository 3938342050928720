// The collective watchdog: it times out on any watched communicator, writes this
// rank's heartbeat while running (and removes it at a normal end), and names the
// missing peer from the others' heartbeats.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "dist/watchdog.h"

using namespace dtrain;
using namespace dtrain::dist;
namespace fs = std::filesystem;

namespace {

// A communicator stuck in one operation.
class StuckComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "stuck"; }
  Handle all_reduce_async(Tensor, ReduceOp, AllreduceAlgo) override { return {}; }
  void reduce_scatter(const Tensor&, Tensor&) override {}
  Handle all_gather_async(Tensor, Tensor) override { return {}; }
  Handle all_to_all_async(Tensor, Tensor) override { return {}; }
  void broadcast(Tensor&, int) override {}
  Handle reduce_async(Tensor, int) override { return {}; }
  Handle all_gatherv_async(Tensor, std::vector<int64_t>) override { return {}; }
  void send(const Tensor&, int) override {}
  void recv(Tensor&, int) override {}
  void exchange(const std::vector<PeerOp>&) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  Topology topology() override { return {}; }
  void set_ranks_per_node(std::optional<int>) override {}
  CommStats stats() const override { return {5, 100, 0.0, 4}; }
  OpRecord last_op() const override { return {5, "all_reduce(ring)", 100}; }
  OpRecord oldest_pending() const override { return {5, "all_reduce(ring)", 100}; }
};

Heartbeat beat(int64_t ms, uint64_t completed, uint64_t pending, int64_t pid) {
  return {ms, completed, pending, pid, "nodeA", false};
}

}  // namespace

TEST_CASE("watchdog: a stuck operation on an added communicator times out, heartbeat kept") {
  const fs::path dir = fs::temp_directory_path() / ("dtrain-wd-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto self = make_self_communicator();
  StuckComm stuck;
  std::mutex mu;
  std::string said;
  {
    Watchdog wd(
        *self, 0.2,
        [&](const std::string& m) {
          std::lock_guard lock(mu);
          if (said.empty()) said = m;
        },
        dir);
    wd.add(stuck);
    for (int i = 0; i < 200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::lock_guard lock(mu);
      if (!said.empty()) break;
    }
    std::ifstream in(dir / "rank-0.heartbeat");
    std::stringstream text;
    text << in.rdbuf();
    const std::optional<Heartbeat> h = parse_heartbeat(text.str());
    REQUIRE(h.has_value());
    CHECK(h->pid == getpid());
    CHECK(h->pending == 0);
  }
  CHECK(said.find("collective #5 all_reduce(ring) of 100 bytes") != std::string::npos);
  CHECK(said.find("(on the stuck communicator)") != std::string::npos);
  CHECK(!fs::exists(dir / "rank-0.heartbeat"));
  fs::remove_all(dir);
}

TEST_CASE("watchdog: heartbeats name the rank that died and the rank that lags") {
  const Heartbeat h = beat(1000, 7, 8, 42);
  const std::optional<Heartbeat> back = parse_heartbeat(format_heartbeat(h));
  REQUIRE(back.has_value());
  CHECK(back->completed == 7);
  CHECK(back->pending == 8);
  CHECK(back->host == "nodeA");
  CHECK(!back->exiting);
  CHECK(!parse_heartbeat("garbage").has_value());
  CHECK(!parse_heartbeat("1 2 3 4 host sleeping").has_value());

  const int64_t now = 100000;
  // Rank 0 (me) and rank 2 wait in #8; rank 1 went silent 9 s ago.
  std::string s =
      describe_peers(0, 8, now, 2500,
                     {beat(now, 7, 8, 10), beat(now - 9000, 5, 0, 11), beat(now - 100, 7, 8, 12)});
  CHECK(s.find("missing peer: rank 1 (pid 11 on nodeA) silent for 9 s") != std::string::npos);
  CHECK(s.find("rank 2") == std::string::npos);
  // Rank 1 alive but outside any collective (a hang in its own code).
  s = describe_peers(0, 8, now, 2500, {beat(now, 7, 8, 10), beat(now - 300, 7, 0, 11)});
  CHECK(s.find("rank 1 (pid 11 on nodeA) is alive but has not reached it (last finished #7, "
               "outside any collective)") != std::string::npos);
  // Rank 1 called exit() and waits in MPI_Finalize.
  Heartbeat leaving = beat(now - 200, 7, 0, 11);
  leaving.exiting = true;
  s = describe_peers(0, 8, now, 2500, {beat(now, 7, 8, 10), leaving});
  CHECK(s ==
        "missing peer: rank 1 (pid 11 on nodeA) is exiting without reaching it (last "
        "finished #7)");
  // Everyone in the same collective: nothing to name; no files at all: nothing known.
  CHECK(describe_peers(0, 8, now, 2500, {beat(now, 7, 8, 10), beat(now, 7, 8, 11)}).empty());
  CHECK(describe_peers(0, 8, now, 2500, {std::nullopt, std::nullopt}).empty());
  CHECK(describe_peers(0, 8, now, 2500, {beat(now, 7, 8, 10), std::nullopt, beat(now, 7, 8, 1)}) ==
        "no heartbeat from rank(s) 1");
}
