// Shared by the multi-process training tests: one OpenMP thread per process (bitwise
// comparisons need the same kernels' thread split) and the check that two runs logged
// the same losses and ended with the same checkpoint, bit for bit.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace dtrain::train_test {

struct OneThread {
  OneThread() { setenv("OMP_NUM_THREADS", "1", 1); }
};

inline void require_same(const fs::path& a, const fs::path& b) {
  const auto la = read_losses(a / "metrics.jsonl"), lb = read_losses(b / "metrics.jsonl");
  REQUIRE(!la.empty());
  CHECK_MESSAGE(first_difference(la, lb).empty(), a.filename().string(), " vs ",
                b.filename().string(), ": ", first_difference(la, lb));
  CHECK(compare_checkpoints(newest_checkpoint(a / "checkpoints"),
                            newest_checkpoint(b / "checkpoints")) == "");
}

// The algorithm comm.allreduce auto chose for the first size class of a run's console
// (`log`: "  241.6 KiB -> ring ..."); a failed REQUIRE when it printed no table.
inline std::string auto_choice(const std::string& log) {
  const size_t arrow = log.find(" -> ");
  REQUIRE_MESSAGE(arrow != std::string::npos, log);
  return log.substr(arrow + 4, log.find(' ', arrow + 4) - arrow - 4);
}

// `dtrain ckpt inspect CHECKPOINT`'s console (in `log`), which must succeed.
inline std::string inspect_checkpoint(const fs::path& checkpoint, const fs::path& log) {
  const RunResult r = run_dtrain_command({"ckpt", "inspect", checkpoint.string()}, log);
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return r.log;
}

// `dtrain train JOB --set run.output_dir=DIR/NAME [--nproc RANKS] EXTRA...`, which must
// succeed (its console in DIR/NAME.log); returns the run directory.
inline fs::path run_job(const fs::path& job, const fs::path& dir, const std::string& name,
                        int ranks, const std::vector<std::string>& extra) {
  const fs::path out = dir / name;
  std::vector<std::string> args = {job.string(), "--set", "run.output_dir=" + out.string()};
  if (ranks > 1) args.insert(args.end(), {"--nproc", std::to_string(ranks)});
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_dtrain(args, dir / (name + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return out;
}

// Top-k at ratio 1 sends every entry, summed in rank order from -0: in a 4-rank `grid`
// (its --set flags) the run is the plain one's bit for bit.
inline void require_topk1_plain(const fs::path& job, const fs::path& dir,
                                const std::vector<std::string>& grid) {
  std::vector<std::string> topk1 = grid;
  topk1.insert(topk1.end(), {"--set", "compress.method=topk", "--set", "compress.ratio=1.0"});
  require_same(run_job(job, dir, "plain", 4, grid), run_job(job, dir, "topk1", 4, topk1));
}

// Gradient compression in a 4-rank grid (`grid`: --set flags) with `method` (its
// `key=value` settings): saved every step, a run stopped at step `stop` and resumed
// with --resume latest; every rank's resumed log took its residual back (no "error
// feedback starts empty"), and the resumed run is the uninterrupted one bit for bit
// (residuals shard by shard). Returns the uninterrupted run's directory.
inline fs::path require_compressed_resume(const fs::path& job, const fs::path& dir,
                                          const std::vector<std::string>& grid,
                                          const std::vector<std::string>& method, int stop) {
  std::string name;
  std::vector<std::string> args = grid;
  for (const std::string& set : method) {
    args.insert(args.end(), {"--set", set});
    if (!name.empty()) name += '-';
    name += set.substr(set.find('=') + 1);
  }
  CAPTURE(name);
  args.insert(args.end(), {"--set", "train.checkpoint.every=1"});
  const fs::path whole = run_job(job, dir, name + "-whole", 4, args);
  std::vector<std::string> first = args, rest = args;
  first.insert(first.end(), {"--set", "train.steps=" + std::to_string(stop)});
  const fs::path out = run_job(job, dir, name, 4, first);
  rest.insert(rest.end(), {"--resume", "latest"});
  run_job(job, dir, name, 4, rest);
  const std::string resumed = "step " + std::to_string(stop + 1) + " loss";
  for (const char* log : {"rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"}) {
    const std::string text = read_bytes(out / "logs" / log);
    CHECK(text.find(resumed) != std::string::npos);  // the resumed run's log
    CHECK_MESSAGE(text.find("error feedback starts empty") == std::string::npos, text);
  }
  require_same(whole, out);
  return whole;
}

// `dtrain estimate JOB --world WORLD --json SETS...`'s JSON (its console in `log`).
inline nlohmann::json estimate_json(const fs::path& job, int world,
                                    const std::vector<std::string>& sets, const fs::path& log) {
  std::vector<std::string> args = {"estimate", job.string(), "--world", std::to_string(world),
                                   "--json"};
  args.insert(args.end(), sets.begin(), sets.end());
  const RunResult e = run_dtrain_command(args, log);
  REQUIRE_MESSAGE(e.rc == 0, e.describe());
  return nlohmann::json::parse(e.log.substr(e.log.find('{')));
}

// `dtrain train args...` must exit 2 with exactly one "error:" line that says `expect`
// (every rank refuses, one message; under --nproc no mpirun banner after it).
inline void check_refused(const std::vector<std::string>& args, const fs::path& log,
                          const std::string& expect) {
  const RunResult r = run_dtrain(args, log);
  CHECK(r.rc == 2);
  size_t count = 0;
  for (size_t at = r.log.find("error:"); at != std::string::npos; at = r.log.find("error:", at + 1))
    ++count;
  CHECK_MESSAGE(count == 1, r.log);
  CHECK_MESSAGE(r.log.find(expect) != std::string::npos, r.log);
  CHECK_MESSAGE(r.log.find("non-zero exit code") == std::string::npos, r.log);
}

}  // namespace dtrain::train_test
