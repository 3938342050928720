// The trainer learns: a tiny ResNet-18 (width 1/8) on 2000 Fashion-MNIST
// training images reaches a test accuracy far above chance (0.1) on 500 test
// images within a few hundred steps. A smoke test of the whole pipeline, not a
// benchmark: neither speed nor a state-of-the-art accuracy is asserted.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace dtrain::train_test;

TEST_CASE("a tiny ResNet learns Fashion-MNIST well above chance") {
  TempDir tmp("learning");
  const fs::path job = write_job(tmp.path());
  const RunResult r =
      run_dtrain({job.string(), "--set", "data.limit={train: 2000, test: 500}", "--set",
                  "data.augment={crop_padding: 0, flip: false}", "--set",
                  "optimizer={name: adamw, lr: 0.003, weight_decay: 0, schedule: {name: cosine}}",
                  "--set", "train.steps=120", "--set", "train.log_every=50"},
                 tmp.path() / "learn.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const auto summary = nlohmann::json::parse(std::ifstream(tmp.path() / "run" / "summary.json"));
  CHECK(summary.at("steps") == 120);
  const double accuracy = summary.at("test_accuracy").get<double>();
  MESSAGE("test accuracy " << accuracy);
  CHECK(accuracy >= 0.65);
}
