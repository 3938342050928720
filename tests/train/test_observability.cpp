// What a run leaves for a person to look at: metrics.jsonl and the TensorBoard event
// files (logging.tensorboard) hold each step once, also after a resume from an earlier
// checkpoint over a run that had gone further (and left a torn last line); the event
// files read back with TensorBoard's own reader (tests/scripts/tensorboard_check.py,
// the `tensorboard` package in the venv the ctest fixture builds at DTRAIN_TB_PYTHON)
// and agree with metrics.jsonl number for number; the per-window monitoring fields.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "harness.h"
#include "runtime/tensorboard.h"

using namespace dtrain::train_test;
namespace rt = dtrain::runtime;

namespace {

std::vector<nlohmann::json> read_lines(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<std::string> job_args(const fs::path& job, int steps) {
  return {job.string(),
          "--set",
          "train.steps=" + std::to_string(steps),
          "--set",
          "train.eval_every=4",
          "--set",
          "train.checkpoint={every: 4, keep: 5}",
          "--set",
          "logging.tensorboard=true"};
}

// TensorBoard's reader on run_dir; its output goes to `log`.
int tensorboard_check(const fs::path& run_dir, const fs::path& log) {
  const fs::path python = DTRAIN_TB_PYTHON;
  const std::string missing = python.string() +
                              " is missing: run this through ctest (its fixture "
                              "observability.tensorboard_setup builds the venv)";
  REQUIRE_MESSAGE(fs::exists(python), missing);
  const std::string cmd = python.string() + " " + DTRAIN_SOURCE_DIR +
                          "/tests/scripts/tensorboard_check.py " + run_dir.string() + " > " +
                          log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

}  // namespace

TEST_CASE(
    "after a resume from an earlier checkpoint each step is logged once, and TensorBoard "
    "reads the same numbers") {
  TempDir tmp("observability-resume");
  const fs::path straight_job = write_job(tmp.path(), "straight");
  const fs::path split_job = write_job(tmp.path(), "split");
  const RunResult whole = run_dtrain(job_args(straight_job, 8), tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  // The split run also goes to step 8, then resumes from its step-4 checkpoint, as a
  // run does after a crash past a checkpoint: steps 5-8 were logged already, and the
  // crash tore the last metrics line.
  const RunResult first = run_dtrain(job_args(split_job, 8), tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  const fs::path split = tmp.path() / "split";
  { std::ofstream(split / "metrics.jsonl", std::ios::app) << "{\"step\": 9, \"lo"; }
  std::vector<std::string> again = job_args(split_job, 8);
  again.insert(again.end(),
               {"--resume", (split / "checkpoints" / "step-00000004.dtckpt").string()});
  const RunResult second = run_dtrain(again, tmp.path() / "b.log");
  REQUIRE_MESSAGE(second.rc == 0, second.describe());

  const std::vector<nlohmann::json> want = read_lines(tmp.path() / "straight" / "metrics.jsonl");
  const std::vector<nlohmann::json> got = read_lines(split / "metrics.jsonl");
  REQUIRE(got.size() == want.size());  // 8 train lines, 2 eval lines, the summary
  CHECK(want.size() == 11);
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].value("step", -1) == want[i].value("step", -1));
    CHECK(got[i].value("loss", 0.0) == want[i].value("loss", 0.0));  // bit for bit
    CHECK(got[i].value("test_loss", 0.0) == want[i].value("test_loss", 0.0));
  }

  // Two event files (one per run segment); over both, every train step once.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(split / "tensorboard")) files.push_back(e.path());
  CHECK(files.size() == 2);
  std::multiset<int64_t> steps;
  for (const fs::path& f : files) {
    bool intact = false;
    for (const std::string& r : rt::read_event_records(f, &intact)) steps.insert(rt::event_step(r));
    CHECK(intact);
  }
  for (int64_t s = 1; s <= 8; ++s) CHECK(steps.count(s) == (s % 4 == 0 ? 2u : 1u));  // + eval

  const int rc = tensorboard_check(split, tmp.path() / "tb.log");
  CHECK_MESSAGE(rc == 0, read_bytes(tmp.path() / "tb.log"));
}

TEST_CASE("train lines carry the process's resident memory and CPU use") {
  TempDir tmp("observability-monitor");
  const fs::path job = write_job(tmp.path());
  const RunResult r = run_dtrain({job.string(), "--set", "train.steps=3"}, tmp.path() / "r.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  int train_lines = 0;
  for (const nlohmann::json& j : read_lines(tmp.path() / "run" / "metrics.jsonl")) {
    if (!j.contains("loss")) continue;
    ++train_lines;
    CHECK(j.value("host_rss_bytes", 0.0) > 1e7);  // the binary and a model: tens of MB at least
    CHECK(j.value("host_rss_bytes", 0.0) >= j.value("peak_host_bytes", 0.0) * 0.5);
    CHECK(j.value("cpu_util", 0.0) > 0.05);
    CHECK(j.value("cpu_util", 0.0) < 64);
    CHECK_FALSE(j.contains("gpu_util_percent"));  // a CPU job
  }
  CHECK(train_lines == 3);
}

TEST_CASE("event files: framing read back, a torn tail and later steps cut on resume") {
  TempDir tmp("observability-events");
  const fs::path dir = tmp.path() / "tb";
  fs::path first;
  {
    rt::EventWriter w(dir, -1);
    for (int64_t s = 1; s <= 5; ++s) w.scalars(s, {{"train/loss", 1.0 / s}, {"train/lr", 0.1}});
    first = w.file();
  }
  bool intact = false;
  std::vector<std::string> records = rt::read_event_records(first, &intact);
  CHECK(intact);
  REQUIRE(records.size() == 6);  // file_version, then steps 1-5
  CHECK(rt::event_step(records[0]) == 0);
  CHECK(rt::event_step(records[5]) == 5);
  const std::string bytes = read_bytes(first);
  write_bytes(first, bytes + bytes.substr(0, 20));  // a torn record at the end
  rt::read_event_records(first, &intact);
  CHECK_FALSE(intact);
  {
    rt::EventWriter w(dir, 3);  // a resume from step 3
    CHECK(w.file() != first);
  }
  records = rt::read_event_records(first, &intact);
  CHECK(intact);
  CHECK(records.size() == 4);  // file_version, steps 1-3
  // A flipped payload byte fails the record's CRC.
  std::string damaged = read_bytes(first);
  damaged[damaged.size() - 6] ^= 0x40;
  write_bytes(first, damaged);
  CHECK(rt::read_event_records(first, &intact).size() == 3);
  CHECK_FALSE(intact);
}
