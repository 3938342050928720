// `dtrain train` in bf16 and fp16 (fp32 master weights, the dtype policy of
// graph::DTypePolicy), end to end on the CPU: the losses follow fp32's, a half run
// resumes bit for bit, and a checkpoint moves between precisions (the masters are an
// fp32 run's parameters, same names and layout).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

std::vector<StepLoss> train(const fs::path& job, const fs::path& dir, const std::string& name,
                            std::vector<std::string> extra) {
  std::vector<std::string> args = {job.string(), "--set",
                                   "run.output_dir=" + (dir / name).string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_dtrain(args, dir / (name + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return read_losses(dir / name / "metrics.jsonl");
}

// A tiny GPT-2 on synthetic tokens (the LM path: embeddings, layer norm, attention).
fs::path gpt_job(const fs::path& dir) {
  const fs::path job = dir / "gpt.yaml";
  std::ofstream(job) << "run: {seed: 7}\n"
                     << "model: {arch: gpt2-tiny, seq_len: 16}\n"
                     << "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
                     << "optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01}\n"
                     << "train: {steps: 8, log_every: 1}\n"
                     << "logging: {console: false}\n";
  return job;
}

}  // namespace

// Tolerance (relative to max(1, |fp32 loss|)): bf16 keeps 8 bits of mantissa (2^-9 relative per
// rounding), and the runs drift apart as their updates differ: 8 steps of these tiny models stay
// within 2% of fp32 (observed at most 0.3%). fp16 skips its first overflowing steps while the
// dynamic scale comes down from 2^15, so its trajectory differs more (5%).
TEST_CASE("bf16 and fp16 follow fp32's losses: ResNet-18 and GPT-2") {
  TempDir tmp("mixed");
  const fs::path resnet = write_job(tmp.path(), "resnet");
  const fs::path gpt = gpt_job(tmp.path());
  for (const fs::path& job : {resnet, gpt}) {
    const std::string model = job.stem().string();
    CAPTURE(model);
    const auto ref = train(job, tmp.path(), model + "-fp32", {});
    REQUIRE(ref.size() == 8);
    const auto bf16 = train(job, tmp.path(), model + "-bf16", {"--set", "precision.dtype=bf16"});
    CHECK_MESSAGE(first_far(ref, bf16, 2e-2, 2e-2) == "", first_far(ref, bf16, 2e-2, 2e-2));
    const auto fp16 = train(job, tmp.path(), model + "-fp16", {"--set", "precision.dtype=fp16"});
    CHECK_MESSAGE(first_far(ref, fp16, 5e-2, 5e-2) == "", first_far(ref, fp16, 5e-2, 5e-2));
  }
}

TEST_CASE("a bf16 run resumes bit for bit, and checkpoints move between fp32 and bf16") {
  TempDir tmp("mixed-resume");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> bf16 = {"--set", "precision.dtype=bf16"};
  const auto whole = train(job, tmp.path(), "whole", bf16);
  std::vector<std::string> first = bf16;
  first.insert(first.end(), {"--set", "train.steps=4"});
  train(job, tmp.path(), "split", first);
  std::vector<std::string> again = bf16;
  again.insert(again.end(), {"--resume", "latest"});
  const auto resumed = train(job, tmp.path(), "split", again);
  CHECK_MESSAGE(first_difference(whole, resumed) == "", first_difference(whole, resumed));
  CHECK(compare_checkpoints(newest_checkpoint(tmp.path() / "whole" / "checkpoints"),
                            newest_checkpoint(tmp.path() / "split" / "checkpoints")) == "");

  // fp32 for 4 steps, then bf16 from its checkpoint; and bf16 then fp32.
  const auto fp32 = train(job, tmp.path(), "fp32", {});
  train(job, tmp.path(), "up", {"--set", "train.steps=4"});
  const auto down =
      train(job, tmp.path(), "up", {"--set", "precision.dtype=bf16", "--resume", "latest"});
  CHECK_MESSAGE(first_far(fp32, down, 2e-2, 2e-2) == "", first_far(fp32, down, 2e-2, 2e-2));
  train(job, tmp.path(), "back", {"--set", "precision.dtype=bf16", "--set", "train.steps=4"});
  const auto back = train(job, tmp.path(), "back", {"--resume", "latest"});
  CHECK_MESSAGE(first_far(fp32, back, 2e-2, 2e-2) == "", first_far(fp32, back, 2e-2, 2e-2));
  // The first four steps of "up" are the fp32 run's, bit for bit.
  CHECK(std::vector<StepLoss>(down.begin(), down.begin() + 4) ==
        std::vector<StepLoss>(fp32.begin(), fp32.begin() + 4));
}

// precision.master_weights: false: the bf16 parameters themselves are stepped (no fp32
// copy), rounded every step. Its losses still follow fp32's over a few steps but differ
// from the master-weight run's; it resumes bit for bit; its checkpoint holds the
// parameters widened to the fp32 layout, so a master-weight job resumes from it.
TEST_CASE("master_weights: false updates bf16 parameters in place and resumes bit for bit") {
  TempDir tmp("mixed-in-place");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> in_place = {"--set", "precision.dtype=bf16", "--set",
                                             "precision.master_weights=false"};
  const auto fp32 = train(job, tmp.path(), "fp32", {});
  const auto masters = train(job, tmp.path(), "masters", {"--set", "precision.dtype=bf16"});
  const auto whole = train(job, tmp.path(), "whole", in_place);
  CHECK_MESSAGE(first_far(fp32, whole, 5e-2, 5e-2) == "", first_far(fp32, whole, 5e-2, 5e-2));
  CHECK(whole != masters);
  std::vector<std::string> first = in_place;
  first.insert(first.end(), {"--set", "train.steps=4"});
  train(job, tmp.path(), "split", first);
  std::vector<std::string> again = in_place;
  again.insert(again.end(), {"--resume", "latest"});
  const auto resumed = train(job, tmp.path(), "split", again);
  CHECK_MESSAGE(first_difference(whole, resumed) == "", first_difference(whole, resumed));
  CHECK(compare_checkpoints(newest_checkpoint(tmp.path() / "whole" / "checkpoints"),
                            newest_checkpoint(tmp.path() / "split" / "checkpoints")) == "");
  train(job, tmp.path(), "to-masters", first);
  const auto continued =
      train(job, tmp.path(), "to-masters", {"--set", "precision.dtype=bf16", "--resume", "latest"});
  REQUIRE(continued.size() == 8);
  CHECK(std::vector<StepLoss>(continued.begin(), continued.begin() + 4) ==
        std::vector<StepLoss>(whole.begin(), whole.begin() + 4));
  CHECK_MESSAGE(first_far(fp32, continued, 5e-2, 5e-2) == "",
                first_far(fp32, continued, 5e-2, 5e-2));
}
