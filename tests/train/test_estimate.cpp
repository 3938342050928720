// `dtrain estimate` against the allocator: for small jobs of every model family, at
// two micro-batch sizes and in fp32, bf16 and fp16, the estimated peak must be within
// 3% of the host allocator's measured peak (peak_host_bytes in the run's summary,
// which covers the whole run: start-up, steps, the final evaluation and checkpoint).
// The estimate replays the executor's allocations from the graph's specs
// (graph/memory_plan.h), so it is exact today; the bound leaves room for what it
// does not model (a loader's late allocations, the allocator's own books).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

struct Family {
  const char* name;
  const char* yaml;  // model, data and optimizer
};

const Family kFamilies[] = {
    {"resnet18",
     "model: {arch: resnet18, stem: small, width: 0.25, image_size: 32, in_channels: 3, "
     "num_classes: 10}\n"
     "data: {dataset: synthetic, global_batch: 32, workers: 1, limit: {test: 64}}\n"
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"},
    {"gpt2-tiny",
     "model: {arch: gpt2-tiny, seq_len: 32, vocab_size: 4096}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 16}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n"},
    {"bert-tiny",
     "model: {arch: bert-tiny, seq_len: 32}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 16}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n"},
    {"vit-tiny",
     "model: {arch: vit-tiny, image_size: 32, patch_size: 8, num_classes: 10}\n"
     "data: {dataset: synthetic, global_batch: 16, workers: 1, limit: {test: 32}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n"},
};

nlohmann::json last_json(const std::string& log) {
  const size_t at = log.find('{');
  REQUIRE_MESSAGE(at != std::string::npos, log);
  return nlohmann::json::parse(log.substr(at));
}

}  // namespace

TEST_CASE("dtrain estimate is within 3% of the measured peak, every family, batch and dtype") {
  TempDir tmp("estimate");
  for (const Family& f : kFamilies) {
    const fs::path job = tmp.path() / (std::string(f.name) + ".yaml");
    std::ofstream(job) << "run: {seed: 3}\n"
                       << f.yaml << "train: {steps: 2, log_every: 1}\n"
                       << "logging: {console: false}\n";
    for (const char* dtype : {"fp32", "bf16", "fp16"}) {
      for (int scale : {1, 2}) {
        CAPTURE(f.name);
        CAPTURE(dtype);
        CAPTURE(scale);
        const std::string run = std::string(f.name) + "-" + dtype + "-" + std::to_string(scale);
        const std::string batch = f.name[0] == 'r'   ? std::to_string(32 * scale)
                                  : f.name[0] == 'v' ? std::to_string(16 * scale)
                                                     : std::to_string(8 * scale);
        const std::vector<std::string> sets = {"--set", std::string("precision.dtype=") + dtype,
                                               "--set", "data.global_batch=" + batch};
        std::vector<std::string> est = {"estimate", job.string(), "--json"};
        est.insert(est.end(), sets.begin(), sets.end());
        const RunResult e = run_dtrain_command(est, tmp.path() / (run + "-estimate.log"));
        REQUIRE_MESSAGE(e.rc == 0, e.describe());
        const nlohmann::json plan = last_json(e.log);
        std::vector<std::string> train = {job.string(), "--set",
                                          "run.output_dir=" + (tmp.path() / run).string()};
        train.insert(train.end(), sets.begin(), sets.end());
        const RunResult t = run_dtrain(train, tmp.path() / (run + ".log"));
        REQUIRE_MESSAGE(t.rc == 0, t.describe());
        double measured = 0;
        std::ifstream metrics(tmp.path() / run / "metrics.jsonl");
        for (std::string line; std::getline(metrics, line);) {
          const nlohmann::json j = nlohmann::json::parse(line);
          if (j.value("summary", false)) measured = j.at("peak_host_bytes").get<double>();
        }
        REQUIRE(measured > 0);
        const double estimated = plan.at("peak_bytes").get<double>();
        MESSAGE(run, ": estimate ", estimated, " B, measured ", measured, " B, at ",
                plan.at("peak_at").get<std::string>());
        CHECK(std::abs(estimated / measured - 1.0) <= 0.03);
      }
    }
  }
}
