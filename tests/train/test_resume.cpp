// Exact resume and determinism of `dtrain train`, end to end through the CLI:
// a run split at a checkpoint and resumed must log the same per-step losses,
// bit for bit, and end with the same parameters and optimizer state as the run
// done in one go — also when an epoch ends between the halves or exactly at
// the split; and a run directory that already holds a run. Does not test damaged
// checkpoints (test_damage.cpp).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

// limit.train 200 / global_batch 32 with the last partial batch dropped: 6 steps
// per epoch, so an epoch ends inside [n, 2n] for n = 4 and at the split for n = 6.
struct ResumeCase {
  const char* name;
  int workers;
  int n;  // steps before the split; the whole run is 2n
  std::vector<std::string> extra;
};

const ResumeCase kResumeCases[] = {
    {"workers0_sgd_epoch_inside", 0, 4, {}},
    {"workers2_adamw_epoch_inside",
     2,
     4,
     {"--set", "optimizer={name: adamw, lr: 0.003, weight_decay: 0.01}"}},
    {"workers2_split_at_epoch_end_micro2", 2, 6, {"--set", "parallel.micro_batches=2"}},
};

std::vector<std::string> job_args(const fs::path& job, const ResumeCase& c, int steps) {
  std::vector<std::string> a = {job.string(), "--set", "data.workers=" + std::to_string(c.workers),
                                "--set", "train.steps=" + std::to_string(steps)};
  a.insert(a.end(), c.extra.begin(), c.extra.end());
  return a;
}

void check_resume_case(const ResumeCase& c) {
  TempDir tmp(std::string("resume-") + c.name);
  const fs::path straight_job = write_job(tmp.path(), "straight");
  const fs::path split_job = write_job(tmp.path(), "split");

  const RunResult whole = run_dtrain(job_args(straight_job, c, 2 * c.n), tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  const RunResult first = run_dtrain(job_args(split_job, c, c.n), tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  const fs::path split_ckpts = tmp.path() / "split" / "checkpoints";
  REQUIRE(checkpoint_step(newest_checkpoint(split_ckpts)) == c.n);

  std::vector<std::string> again = job_args(split_job, c, 2 * c.n);
  again.insert(again.end(), {"--resume", "latest"});
  const RunResult second = run_dtrain(again, tmp.path() / "b.log");
  REQUIRE_MESSAGE(second.rc == 0, second.describe());
  CHECK_MESSAGE(second.log.find("at step " + std::to_string(c.n)) != std::string::npos, second.log);
  // The one setting the resume changes, named from the job the checkpoint keeps.
  CHECK_MESSAGE(second.log.find(fmt::format("was written with: train.steps {} -> {}; the model "
                                            "matches",
                                            c.n, 2 * c.n)) != std::string::npos,
                second.log);

  const auto expected = read_losses(tmp.path() / "straight" / "metrics.jsonl");
  const auto resumed = read_losses(tmp.path() / "split" / "metrics.jsonl");
  REQUIRE(expected.size() == static_cast<size_t>(2 * c.n));
  CHECK_MESSAGE(first_difference(expected, resumed) == "", first_difference(expected, resumed));

  const fs::path a = newest_checkpoint(tmp.path() / "straight" / "checkpoints");
  const fs::path b = newest_checkpoint(split_ckpts);
  REQUIRE(checkpoint_step(a) == 2 * c.n);
  CHECK_MESSAGE(compare_checkpoints(a, b) == "", compare_checkpoints(a, b));
}

std::vector<StepLoss> run_for_losses(const TempDir& tmp, const std::string& name,
                                     const std::vector<std::string>& sets) {
  std::vector<std::string> args = {write_job(tmp.path(), name).string()};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  const RunResult r = run_dtrain(args, tmp.path() / (name + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return read_losses(tmp.path() / name / "metrics.jsonl");
}

}  // namespace

TEST_CASE("resume latest continues bit for bit") {
  for (const ResumeCase& c : kResumeCases) {
    SUBCASE(c.name) { check_resume_case(c); }
  }
}

TEST_CASE("the same job gives the same bits and another seed does not") {
  TempDir tmp("determinism");
  const auto a = run_for_losses(tmp, "a", {"data.workers=0"});
  const auto b = run_for_losses(tmp, "b", {"data.workers=0"});
  REQUIRE(a.size() == 8);
  CHECK_MESSAGE(first_difference(a, b) == "", first_difference(a, b));
  const fs::path ca = newest_checkpoint(tmp.path() / "a" / "checkpoints");
  const fs::path cb = newest_checkpoint(tmp.path() / "b" / "checkpoints");
  CHECK_MESSAGE(compare_checkpoints(ca, cb) == "", compare_checkpoints(ca, cb));

  // Loader threads only prefetch: the batches, hence the bits, do not depend on them.
  const auto threaded = run_for_losses(tmp, "threaded", {"data.workers=2"});
  CHECK_MESSAGE(first_difference(a, threaded) == "", first_difference(a, threaded));

  const auto other = run_for_losses(tmp, "other", {"data.workers=0", "run.seed=2"});
  REQUIRE(other.size() == a.size());
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i].loss == other[i].loss;
  CHECK_MESSAGE(same == 0, same << " of " << a.size() << " losses equal across seeds 1 and 2");
}

// A fresh run beside an earlier run's checkpoints would prune its own (theirs have the
// higher steps) and hand a later --resume latest theirs: refused, touching nothing. A
// resume at the job's last step (a requeue after the end) trains and writes nothing; a
// checkpoint past it is refused; a longer job continues it.
TEST_CASE("a run directory that holds a run: a fresh start is refused, a finished run stays") {
  constexpr int kExitBadInput = 2;
  TempDir tmp("rerun");
  const fs::path job = write_job(tmp.path(), "run");
  const fs::path out = tmp.path() / "run";
  const RunResult first =
      run_dtrain({job.string(), "--set", "train.steps=4"}, tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  const std::string metrics = read_bytes(out / "metrics.jsonl");
  const std::string summary = read_bytes(out / "summary.json");
  const fs::path ckpt = newest_checkpoint(out / "checkpoints");
  REQUIRE(checkpoint_step(ckpt) == 4);
  const auto untouched = [&] {
    CHECK(read_bytes(out / "metrics.jsonl") == metrics);
    CHECK(read_bytes(out / "summary.json") == summary);
    CHECK(newest_checkpoint(out / "checkpoints") == ckpt);
  };

  const RunResult fresh =
      run_dtrain({job.string(), "--set", "train.steps=2"}, tmp.path() / "b.log");
  CHECK_MESSAGE(fresh.rc == kExitBadInput, fresh.describe());
  CHECK_MESSAGE(contains(fresh.log, "holds 1 checkpoint(s) of an earlier run"), fresh.log);
  CHECK_MESSAGE(contains(fresh.log, "--resume latest"), fresh.log);
  untouched();

  const RunResult done = run_dtrain({job.string(), "--set", "train.steps=4", "--resume", "latest"},
                                    tmp.path() / "c.log");
  CHECK_MESSAGE(done.rc == 0, done.describe());
  CHECK_MESSAGE(contains(done.log, "nothing left to train"), done.log);
  untouched();

  const RunResult past = run_dtrain({job.string(), "--set", "train.steps=3", "--resume", "latest"},
                                    tmp.path() / "d.log");
  CHECK_MESSAGE(past.rc == kExitBadInput, past.describe());
  CHECK_MESSAGE(contains(past.log,
                         "train.steps: the checkpoint is at step 4, past the job's "
                         "last step 3"),
                past.log);
  untouched();

  // The run directory stands for its checkpoints/ (as for dtrain ckpt).
  const RunResult more = run_dtrain(
      {job.string(), "--set", "train.steps=6", "--resume", out.string()}, tmp.path() / "e.log");
  REQUIRE_MESSAGE(more.rc == 0, more.describe());
  CHECK(checkpoint_step(newest_checkpoint(out / "checkpoints")) == 6);
  const auto losses = read_losses(out / "metrics.jsonl");
  REQUIRE(losses.size() == 6);
  for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i].step == static_cast<int64_t>(i + 1));

  // Resuming from step 4 (not the newest) abandons steps 5 and 6: their checkpoint moves
  // to checkpoints/abandoned/, so a later --resume latest takes this run's step 5.
  const fs::path step4 = out / "checkpoints" / "step-00000004.dtckpt";
  REQUIRE(fs::exists(step4));
  // A resume refused at start-up (past its last step) moves nothing.
  const RunResult refused = run_dtrain(
      {job.string(), "--set", "train.steps=3", "--resume", step4.string()}, tmp.path() / "r.log");
  CHECK_MESSAGE(refused.rc == kExitBadInput, refused.describe());
  CHECK(checkpoint_step(newest_checkpoint(out / "checkpoints")) == 6);
  const RunResult branch = run_dtrain({job.string(), "--set", "train.steps=5", "--set",
                                       "optimizer.lr=0.01", "--resume", step4.string()},
                                      tmp.path() / "f.log");
  REQUIRE_MESSAGE(branch.rc == 0, branch.describe());
  CHECK_MESSAGE(contains(branch.log, "1 later checkpoint(s) of the run this one abandons"),
                branch.log);
  CHECK(fs::exists(out / "checkpoints" / "abandoned" / "from-step-4" / "step-00000006.dtckpt"));
  const RunResult latest = run_dtrain(
      {job.string(), "--set", "train.steps=7", "--set", "optimizer.lr=0.01", "--resume", "latest"},
      tmp.path() / "g.log");
  REQUIRE_MESSAGE(latest.rc == 0, latest.describe());
  CHECK_MESSAGE(contains(latest.log, "step-00000005.dtckpt at step 5"), latest.log);
  const auto all = read_losses(out / "metrics.jsonl");
  REQUIRE(all.size() == 7);  // every step once
  for (size_t i = 0; i < all.size(); ++i) CHECK(all[i].step == static_cast<int64_t>(i + 1));
}

// An epoch is cut into whole steps of data.global_batch samples. A checkpoint whose data
// position lies inside a step (another global batch's; or an older dtrain's, which cut
// epochs by micro-batches) resumes at the next step's start and says so: the epoch's
// steps stay whole from there on (200 samples, steps of 32: 6 an epoch, 8 dropped).
TEST_CASE("a data position inside a step resumes at the next step's start, with a note") {
  TempDir tmp("resume-inside-step");
  const fs::path job = write_job(tmp.path(), "run");
  const RunResult first = run_dtrain({job.string(), "--set", "data.global_batch=16", "--set",
                                      "train.steps=1", "--set", "train.checkpoint.every=1"},
                                     tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  const RunResult second = run_dtrain(
      {job.string(), "--set", "train.steps=6", "--resume", "latest"}, tmp.path() / "b.log");
  REQUIRE_MESSAGE(second.rc == 0, second.describe());
  CHECK_MESSAGE(second.log.find("data position (epoch 0, sample 16) is inside a step of 32 "
                                "samples; the run goes on from the next step's start, 16 "
                                "samples on") != std::string::npos,
                second.log);
  // Steps 2-6 take samples 32-191 of epoch 0; the next epoch starts after the 6th step.
  const RunResult inspect = run_dtrain_command(
      {"ckpt", "inspect", newest_checkpoint(tmp.path() / "run" / "checkpoints").string()},
      tmp.path() / "inspect.log");
  REQUIRE_MESSAGE(inspect.rc == 0, inspect.describe());
  CHECK_MESSAGE(inspect.log.find("data position: epoch 1, offset 0") != std::string::npos,
                inspect.log);
}
