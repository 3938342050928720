// Graceful stop: SIGTERM, SIGINT or SIGUSR1 in the middle of a run must end it with
// exit code 4 after a checkpoint at the step it reached, and `--resume latest`
// must then finish the run with the losses an uninterrupted run logs, bit for
// bit. The signal lands wherever the run happens to be, so the assertions hold
// for any stopping step. Does not cover signals during start-up.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

constexpr int kExitInterrupted = 4;
constexpr int kSteps = 60;

// A warm-up + cosine schedule makes every step's update depend on the step
// counter, so a resume that lost or repeated a step would show.
std::vector<std::string> job_args(const fs::path& job) {
  return {job.string(), "--set", "train.steps=" + std::to_string(kSteps), "--set",
          "optimizer.schedule={name: cosine, warmup_steps: 5}"};
}

// Waits until the run has logged `lines` train steps; false if it ended first.
bool wait_for_steps(pid_t pid, const fs::path& metrics, size_t lines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(metrics) && count_lines(metrics) >= lines) return true;
    if (!still_running(pid)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

void check_stop_and_resume(int sig, const std::string& name) {
  TempDir tmp("signal-" + name);
  const fs::path job = write_job(tmp.path());
  const fs::path run_dir = tmp.path() / "run";
  const pid_t pid = spawn_dtrain(job_args(job), tmp.path() / "stopped.log");
  const bool started = wait_for_steps(pid, run_dir / "metrics.jsonl", 3);
  if (started) ::kill(pid, sig);
  const RunResult stopped = wait_dtrain(pid, tmp.path() / "stopped.log");
  REQUIRE_MESSAGE(started, "the run ended before 3 steps were logged; " << stopped.describe());
  REQUIRE_MESSAGE(stopped.rc == kExitInterrupted, stopped.describe());

  const auto logged = read_losses(run_dir / "metrics.jsonl");
  REQUIRE(!logged.empty());
  const int64_t at = logged.back().step;
  CHECK(at < kSteps);
  CHECK_MESSAGE(checkpoint_step(newest_checkpoint(run_dir / "checkpoints")) == at,
                "no checkpoint at step " << at << "; " << stopped.describe());
  CHECK(!fs::exists(run_dir / "summary.json"));
  // The run so far drawn (its train lines, no summary).
  CHECK(read_bytes(run_dir / "report.html").find("<svg") != std::string::npos);

  std::vector<std::string> again = job_args(job);
  again.insert(again.end(), {"--resume", "latest"});
  const RunResult resumed = run_dtrain(again, tmp.path() / "resumed.log");
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.describe());

  const fs::path ref_job = write_job(tmp.path(), "reference");
  const RunResult ref = run_dtrain(job_args(ref_job), tmp.path() / "reference.log");
  REQUIRE_MESSAGE(ref.rc == 0, ref.describe());
  // Interrupted lines 1..at, then the resumed run's at+1..kSteps, in one file.
  const auto whole = read_losses(run_dir / "metrics.jsonl");
  const auto expected = read_losses(tmp.path() / "reference" / "metrics.jsonl");
  REQUIRE(expected.size() == kSteps);
  CHECK_MESSAGE(first_difference(expected, whole) == "", first_difference(expected, whole));
  const fs::path a = newest_checkpoint(run_dir / "checkpoints");
  const fs::path b = newest_checkpoint(tmp.path() / "reference" / "checkpoints");
  CHECK_MESSAGE(compare_checkpoints(a, b) == "", compare_checkpoints(a, b));
}

}  // namespace

TEST_CASE("SIGTERM stops with a checkpoint and resume matches an uninterrupted run") {
  check_stop_and_resume(SIGTERM, "term");
}

TEST_CASE("SIGINT stops with a checkpoint and resume matches an uninterrupted run") {
  check_stop_and_resume(SIGINT, "int");
}

TEST_CASE("SIGUSR1 (SLURM's early warning) stops with a checkpoint and resume matches") {
  check_stop_and_resume(SIGUSR1, "usr1");
}

// A crash is not a stop: the run says, before it dies, that a fatal signal ended it and
// how many steps it had done (runtime::report_fatal_signals), then dies of that signal
// (the handlers hand it on to its default action: the harness sees 128 + SIGABRT).
TEST_CASE("a crash names the signal and the steps done, then ends as that signal does") {
  TempDir tmp("signal-abort");
  const fs::path job = write_job(tmp.path());
  setenv("DTRAIN_TEST_FAULT", "0:2:abort", 1);
  const RunResult r =
      run_dtrain({job.string(), "--set", "train.steps=5"}, tmp.path() / "abort.log");
  unsetenv("DTRAIN_TEST_FAULT");
  CHECK_MESSAGE(r.rc == 128 + SIGABRT, r.describe());
  CHECK_MESSAGE(r.log.find("dtrain: ended by signal 6 (SIGABRT, aborted) with 2 step(s) done") !=
                    std::string::npos,
                r.log);
}
