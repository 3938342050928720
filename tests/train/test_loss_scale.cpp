// The loss scaler and non-finite gradients in `dtrain train`, end to end, on fp32
// (the scaler's logic does not depend on the dtype; a power-of-two scale changes
// no fp32 bit). Overflows come from DTRAIN_TEST_OVERFLOW (src/runtime/faults.h),
// which writes +inf into the last parameter's gradient at the listed steps.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

std::vector<nlohmann::json> metrics(const fs::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(std::move(j));
  }
  return out;
}

// Runs with DTRAIN_TEST_OVERFLOW set to `overflow` (empty: unset).
RunResult run_with_overflow(const std::string& overflow, const std::vector<std::string>& args,
                            const fs::path& log) {
  if (overflow.empty()) {
    unsetenv("DTRAIN_TEST_OVERFLOW");
  } else {
    setenv("DTRAIN_TEST_OVERFLOW", overflow.c_str(), 1);
  }
  RunResult r = run_dtrain(args, log);
  unsetenv("DTRAIN_TEST_OVERFLOW");
  return r;
}

const std::vector<std::string> kAdamCosine = {
    "--set",
    "optimizer={name: adamw, lr: 0.003, weight_decay: 0.01, "
    "schedule: {name: cosine, warmup_steps: 2}}"};

std::vector<std::string> with(const fs::path& job, std::vector<std::string> extra) {
  std::vector<std::string> args = {job.string()};
  args.insert(args.end(), kAdamCosine.begin(), kAdamCosine.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

TEST_CASE("a power-of-two loss scale, growing as it goes, changes no fp32 bit") {
  TempDir tmp("lossscale-bits");
  const RunResult plain =
      run_dtrain(with(write_job(tmp.path(), "plain"), {}), tmp.path() / "p.log");
  REQUIRE_MESSAGE(plain.rc == 0, plain.describe());
  const RunResult scaled = run_dtrain(
      with(write_job(tmp.path(), "scaled"),
           {"--set", "precision.loss_scale={mode: dynamic, init: 1024, growth_interval: 3}"}),
      tmp.path() / "s.log");
  REQUIRE_MESSAGE(scaled.rc == 0, scaled.describe());
  const auto a = read_losses(tmp.path() / "plain" / "metrics.jsonl");
  const auto b = read_losses(tmp.path() / "scaled" / "metrics.jsonl");
  REQUIRE(a.size() == 8);
  CHECK_MESSAGE(first_difference(a, b) == "", first_difference(a, b));
  const auto m = metrics(tmp.path() / "scaled" / "metrics.jsonl");
  CHECK(m.at(2).at("loss_scale") == 2048.0);  // grew after steps 3 and 6
  CHECK(m.at(7).at("loss_scale") == 4096.0);
  CHECK(m.at(7).at("skipped_steps") == 0);
  CHECK(compare_checkpoint_state(newest_checkpoint(tmp.path() / "plain" / "checkpoints"),
                                 newest_checkpoint(tmp.path() / "scaled" / "checkpoints")) == "");
}

TEST_CASE("an overflow skips the step: nothing changes, the scale backs off, the schedule waits") {
  TempDir tmp("lossscale-skip");
  const std::vector<std::string> extra = {
      "--set", "precision.loss_scale={mode: dynamic, init: 1024, growth_interval: 100}", "--set",
      "train.checkpoint={every: 1, keep: 10}"};
  const RunResult clean =
      run_dtrain(with(write_job(tmp.path(), "clean"), extra), tmp.path() / "c.log");
  REQUIRE_MESSAGE(clean.rc == 0, clean.describe());
  const RunResult r =
      run_with_overflow("*:3", with(write_job(tmp.path(), "skip"), extra), tmp.path() / "s.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(r.log.find("step 3: inf or nan in the gradients (first in ") != std::string::npos,
                r.log);
  CHECK_MESSAGE(
      r.log.find("element 0 = inf); step skipped, loss scale 1024 -> 512") != std::string::npos,
      r.log);
  // Weights, buffers and optimizer state after step 3 are those after step 2.
  const fs::path ck = tmp.path() / "skip" / "checkpoints";
  CHECK(compare_checkpoint_state(ck / "step-00000002.dtckpt", ck / "step-00000003.dtckpt") == "");
  CHECK(compare_checkpoint_state(ck / "step-00000003.dtckpt", ck / "step-00000004.dtckpt") != "");
  const auto m = metrics(tmp.path() / "skip" / "metrics.jsonl");
  const auto c = metrics(tmp.path() / "clean" / "metrics.jsonl");
  REQUIRE(m.size() == 8);
  CHECK(m[1].at("loss_scale") == 1024.0);
  CHECK(m[2].at("loss_scale") == 512.0);
  CHECK(m[2].at("skipped_steps") == 1);
  CHECK(m[7].at("skipped_steps") == 1);
  // The cosine schedule counts applied updates: the run after the skip is one behind.
  CHECK(m[2].at("lr") == c[1].at("lr"));
  CHECK(m[3].at("lr") == c[2].at("lr"));
  CHECK(m[7].at("lr") == c[6].at("lr"));
  // Step 3's loss (computed before the skip) is the clean run's.
  CHECK(m[2].at("loss") == c[2].at("loss"));
}

TEST_CASE("without loss scaling an inf gradient ends the run with exit 3, naming step and tensor") {
  TempDir tmp("lossscale-none");
  const RunResult r =
      run_with_overflow("*:2", with(write_job(tmp.path()), {}), tmp.path() / "r.log");
  CHECK(r.rc == 3);
  CHECK_MESSAGE(r.log.find("step 2: the loss is ") != std::string::npos, r.log);
  CHECK_MESSAGE(
      r.log.find("and the gradient holds inf or nan (first in fc.bias, element 0 = inf)") !=
          std::string::npos,
      r.log);
  // No checkpoint exists at step 2: the hint does not offer one.
  CHECK_MESSAGE(
      r.log.find("hint: lower optimizer.lr or add optimizer.clip_grad_norm\n") != std::string::npos,
      r.log);
  // With a checkpoint written at step 2, an overflow at step 4 offers it.
  const RunResult later = run_with_overflow(
      "*:4", with(write_job(tmp.path(), "later"), {"--set", "train.checkpoint.every=2"}),
      tmp.path() / "later.log");
  CHECK(later.rc == 3);
  CHECK_MESSAGE(later.log.find("or resume from an earlier checkpoint") != std::string::npos,
                later.log);
}

TEST_CASE("an overflow at the minimum scale: exit 3 with on_min error, skip with clamp") {
  TempDir tmp("lossscale-min");
  const std::string scale = "precision.loss_scale={mode: dynamic, init: 2, min: 1, on_min: ";
  const RunResult err =
      run_with_overflow("*:2,3", with(write_job(tmp.path(), "err"), {"--set", scale + "error}"}),
                        tmp.path() / "e.log");
  CHECK(err.rc == 3);
  CHECK_MESSAGE(
      err.log.find("step 3: inf or nan in the gradients (first in fc.bias") != std::string::npos,
      err.log);
  CHECK_MESSAGE(err.log.find("already at precision.loss_scale.min = 1") != std::string::npos,
                err.log);
  const RunResult clamp =
      run_with_overflow("*:2,3", with(write_job(tmp.path(), "clamp"), {"--set", scale + "clamp}"}),
                        tmp.path() / "c.log");
  REQUIRE_MESSAGE(clamp.rc == 0, clamp.describe());
  const auto m = metrics(tmp.path() / "clamp" / "metrics.jsonl");
  CHECK(m.at(2).at("loss_scale") == 1.0);
  CHECK(m.at(7).at("skipped_steps") == 2);
  CHECK_MESSAGE(clamp.log.find("were skipped") == std::string::npos, clamp.log);
  // Most steps skipped: the run still ends with exit 0, and a warning says so.
  const RunResult most = run_with_overflow(
      "*:1,2,3,4,5", with(write_job(tmp.path(), "most"), {"--set", scale + "clamp}"}),
      tmp.path() / "m.log");
  REQUIRE_MESSAGE(most.rc == 0, most.describe());
  CHECK_MESSAGE(most.log.find("warning: 5 of the run's 8 steps were skipped") != std::string::npos,
                most.log);
}

TEST_CASE("the scaler's state is in the checkpoint: a run resumed across overflows is exact") {
  TempDir tmp("lossscale-resume");
  const std::vector<std::string> extra = {
      "--set",
      "precision.loss_scale={mode: dynamic, init: 256, growth_interval: 2, hysteresis: 2}"};
  const RunResult whole = run_with_overflow("*:2,3,6", with(write_job(tmp.path(), "whole"), extra),
                                            tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  std::vector<std::string> first = with(write_job(tmp.path(), "split"), extra);
  first.insert(first.end(), {"--set", "train.steps=4"});
  const RunResult a = run_with_overflow("*:2,3,6", first, tmp.path() / "a.log");
  REQUIRE_MESSAGE(a.rc == 0, a.describe());
  std::vector<std::string> second = with(tmp.path() / "split.yaml", extra);
  second.insert(second.end(), {"--resume", "latest"});
  const RunResult b = run_with_overflow("*:2,3,6", second, tmp.path() / "b.log");
  REQUIRE_MESSAGE(b.rc == 0, b.describe());
  const auto mw = metrics(tmp.path() / "whole" / "metrics.jsonl");
  const auto ms = metrics(tmp.path() / "split" / "metrics.jsonl");
  REQUIRE(mw.size() == 8);
  REQUIRE(ms.size() == 8);
  for (size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(mw[i].at("loss") == ms[i].at("loss"));
    CHECK(mw[i].at("loss_scale") == ms[i].at("loss_scale"));
    CHECK(mw[i].at("skipped_steps") == ms[i].at("skipped_steps"));
  }
  CHECK(mw[7].at("skipped_steps") == 3);
  CHECK(compare_checkpoints(newest_checkpoint(tmp.path() / "whole" / "checkpoints"),
                            newest_checkpoint(tmp.path() / "split" / "checkpoints")) == "");
}
