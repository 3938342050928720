// Activation checkpointing (memory.checkpointing) is exact: a checkpointed segment's
// forward runs again in backward with the same RNG keys (dropout draws the same
// masks) and batch norm updates its running statistics once, so every loss and the
// final checkpoint (parameters, buffers, optimizer state) are bit for bit those of
// `none`, for ResNet (batch norm), GPT-2 and BERT (dropout 0.1), with each policy.
// Its memory: the estimate's training activations fall, and the run's measured peak
// is the estimate's (graph/memory_plan.h replays the recompute).
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

const char* const kJobs[][2] = {
    {"resnet18",
     "model: {arch: resnet18, stem: small, width: 0.25, image_size: 32, in_channels: 3, "
     "num_classes: 10}\n"
     "data: {dataset: synthetic, global_batch: 16, workers: 1, limit: {test: 16}}\n"
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"},
    {"gpt2-tiny",
     "model: {arch: gpt2-tiny, seq_len: 32, vocab_size: 2048, dropout: 0.1}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n"},
    {"bert-tiny",
     "model: {arch: bert-tiny, seq_len: 32, dropout: 0.1}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n"},
};

nlohmann::json estimate(const fs::path& job, const fs::path& dir, const std::string& policy) {
  const RunResult r = run_dtrain_command(
      {"estimate", job.string(), "--json", "--set", "memory.checkpointing=" + policy},
      dir / ("estimate-" + policy + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return nlohmann::json::parse(r.log.substr(r.log.find('{')));
}

}  // namespace

TEST_CASE("activation checkpointing repeats the losses and checkpoint of none, bit for bit") {
  for (const auto& [name, yaml] : kJobs) {
    CAPTURE(name);
    TempDir tmp(std::string("checkpointing-") + name);
    const fs::path job = tmp.path() / "job.yaml";
    std::ofstream(job) << "run: {seed: 5}\n"
                       << yaml << "train: {steps: 4, log_every: 1}\nlogging: {console: false}\n";
    auto train = [&](const std::string& policy, std::vector<std::string> extra = {}) {
      std::vector<std::string> args = {job.string(), "--set", "memory.checkpointing=" + policy,
                                       "--set", "run.output_dir=" + (tmp.path() / policy).string()};
      args.insert(args.end(), extra.begin(), extra.end());
      const RunResult r = run_dtrain(args, tmp.path() / (policy + ".log"));
      REQUIRE_MESSAGE(r.rc == 0, r.describe());
      return read_losses(tmp.path() / policy / "metrics.jsonl");
    };
    const auto none = train("none");
    REQUIRE(none.size() == 4);
    const fs::path ref = newest_checkpoint(tmp.path() / "none" / "checkpoints");
    const double none_activations = estimate(job, tmp.path(), "none").at("train_activation_bytes");
    for (const char* policy : {"block", "every_k", "sqrt"}) {
      CAPTURE(policy);
      const auto losses = train(policy, {"--set", "memory.every_k=2"});
      CHECK_MESSAGE(first_difference(none, losses) == "", first_difference(none, losses));
      CHECK(compare_checkpoints(ref, newest_checkpoint(tmp.path() / policy / "checkpoints")) == "");
      const nlohmann::json e = estimate(job, tmp.path(), policy);
      CHECK(e.at("train_activation_bytes").get<double>() < none_activations);
      const double measured = summary_value(tmp.path() / policy, "peak_host_bytes");
      CHECK(std::abs(e.at("peak_bytes").get<double>() / measured - 1.0) <= 0.03);
    }
  }
}
