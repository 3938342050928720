// Unit tests of the typed layer: defaults and derived defaults, --set overrides,
// combination checks, warnings, file limits, and dump -> load -> dump round trips.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"

using namespace dtrain;
using namespace dtrain::config;

namespace {

const char* kMinimal = "model:\n  arch: resnet50\ntrain:\n  steps: 100\n";

Job load(const std::string& text, std::vector<std::string> sets = {}, int world = 1,
         std::vector<std::string>* warnings = nullptr) {
  ValidateContext ctx;
  ctx.world_size = world;
  ctx.warnings = warnings;
  return load_job_text(text, "job.yaml", sets, ctx);
}

std::string error_of(const std::string& text, std::vector<std::string> sets = {}, int world = 1) {
  try {
    load(text, std::move(sets), world);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("a minimal job gets every default") {
  const Job job = load(kMinimal);
  CHECK(job.model.arch == "resnet50");
  CHECK(*job.model.image_size == 224);
  CHECK_FALSE(job.model.heads.has_value());
  CHECK(*job.train.steps == 100);
  CHECK_FALSE(job.train.epochs.has_value());
  CHECK(job.optimizer.name == OptimizerName::adamw);
  CHECK(job.optimizer.lr == doctest::Approx(1e-3));
  CHECK(job.precision.loss_scale.init == 32768.0);
  CHECK(job.precision.loss_scale.growth_interval == 2000);
  CHECK(job.parallel.data == 1);
  CHECK(job.data.micro_batch == job.data.global_batch);
  CHECK(job.parallel.micro_batches == 1);
  CHECK(job.train.checkpoint.dir == "runs/checkpoints");
  CHECK(job.device == Device::cpu());
  CHECK_FALSE(job.precision.tf32);
}

TEST_CASE("derived defaults: data parallel size, micro-batching, presets, loss scaling") {
  const Job dp = load(std::string(kMinimal) + "data: {global_batch: 64}\n", {}, 4);
  CHECK(dp.parallel.data == 4);
  CHECK(dp.data.micro_batch == 16);
  const Job accum =
      load(std::string(kMinimal) + "data: {global_batch: 64, micro_batch: 8}\n", {}, 2);
  CHECK(accum.parallel.micro_batches == 4);
  const Job by_steps =
      load(std::string(kMinimal) + "data: {global_batch: 64}\nparallel: {micro_batches: 4}\n");
  CHECK(by_steps.data.micro_batch == 16);
  const Job bert = load("model: {arch: bert-base, hidden: 512, heads: 8}\ntrain: {epochs: 2}\n");
  CHECK(*bert.model.ffn == 2048);
  CHECK(*bert.model.layers == 12);
  CHECK(*bert.model.vocab_size == 30522);
  const Job mnist =
      load("model: {arch: resnet18}\ndata: {dataset: mnist, path: /d}\ntrain: {steps: 1}\n");
  CHECK(*mnist.model.image_size == 28);
  CHECK(*mnist.model.in_channels == 1);
  CHECK(*mnist.model.num_classes == 10);
  const Job half = load(std::string(kMinimal) + "precision: {dtype: fp16}\n");
  CHECK(half.precision.loss_scale.mode == LossScaleMode::dynamic);
  const Job bf = load(std::string(kMinimal) + "precision: {dtype: bf16}\n");
  CHECK(bf.precision.loss_scale.mode == LossScaleMode::none);
}

TEST_CASE("integers may be written as integral reals, fractions are refused") {
  CHECK(*load("model: {arch: resnet50}\ntrain: {steps: 1e3}\n").train.steps == 1000);
  CHECK(has(error_of("model: {arch: resnet50}\ntrain: {steps: 2.5}\n"),
            "job.yaml:2:16: train.steps: expected a positive integer, got 2.5"));
}

TEST_CASE("--set overrides are read like the file") {
  const Job job = load(kMinimal,
                       {"optimizer.lr=0.5", "optimizer.betas=[0.8, 0.9]", "device=cuda:1",
                        "parallel={zero_stage: 1}", "train.steps=7", "train.steps=8"},
                       2);
  CHECK(job.optimizer.lr == 0.5);
  CHECK(job.optimizer.betas[0] == 0.8);
  CHECK(job.device == Device::cuda(1));
  CHECK(job.parallel.zero_stage == 1);
  CHECK(*job.train.steps == 8);  // the last --set wins
  CHECK(job.parallel.data == 2);
  CHECK(has(error_of(kMinimal, {"optimizer.lr=fast"}),
            "--set optimizer.lr=fast: optimizer.lr: expected a positive number, got \"fast\""));
  CHECK(has(error_of(kMinimal, {"optimizer.lrr=1"}), "(did you mean \"optimizer.lr\"?)"));
  CHECK(has(error_of(kMinimal, {"optimizer.lr"}), "--set optimizer.lr: expected key.path=value"));
  CHECK(has(error_of(kMinimal, {"=1"}), "is not a key path"));
  // A --set may fill a section the file leaves empty.
  CHECK(load("model: {arch: resnet50}\ntrain:\n", {"train.steps=3"}).train.steps == 3);
}

TEST_CASE("unknown keys suggest the closest key, also from other sections") {
  CHECK(has(error_of(std::string(kMinimal) + "optimiser: {}\n"),
            "job.yaml:5:1: unknown key \"optimiser\" (did you mean \"optimizer\"?)"));
  CHECK(has(error_of(std::string(kMinimal) + "data: {global_bacth: 8}\n"),
            "(did you mean \"data.global_batch\"?)"));
  CHECK(has(error_of(std::string(kMinimal) + "zero_stage: 2\n"),
            "(did you mean \"parallel.zero_stage\"?)"));
}

TEST_CASE("impossible combinations fail naming the deciding key") {
  CHECK(has(error_of(std::string(kMinimal) + "parallel: {data: 3}\n", {}, 4),
            "parallel.data: tensor (1) x pipeline (1) x data (3) = 3, but the world size is 4"));
  CHECK(has(error_of("model: {arch: bert-base}\ntrain: {steps: 1}\nparallel: {tensor: 8}\n", {}, 8),
            "12 heads cannot be split over parallel.tensor = 8"));
  CHECK(has(error_of(std::string(kMinimal) +
                     "optimizer: {name: lamb}\nprecision: {dtype: bf16, master_weights: false}\n"),
            "precision.master_weights: false updates the half parameters in place, which LAMB "
            "cannot"));
  CHECK(has(error_of("model: {arch: resnet50}\ntrain: {}\n"), "set how long to train"));
  CHECK(has(error_of("model: {arch: resnet50}\ntrain: {steps: 1, epochs: 1}\n"), "not both"));
  CHECK(has(error_of("model: {arch: vit-base, image_size: 100}\ntrain: {steps: 1}\n"),
            "model.image_size: 100 is not divisible by model.patch_size (16)"));
}

TEST_CASE("validate_job works on a Job built in code, naming keys without positions") {
  Job job;
  job.model = preset_options(*find_arch("gpt2"));
  job.train.steps = 10;
  job.parallel.tensor = 5;
  job.parallel.data = 1;
  ValidateContext ctx;
  ctx.world_size = 5;
  try {
    validate_job(job, ctx);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("model.heads: 12 heads cannot be split") == 0);
  }
  job.parallel.tensor = 4;
  ctx.world_size = 4;
  CHECK_NOTHROW(validate_job(job, ctx));
}

TEST_CASE("warnings for legal but useless settings") {
  std::vector<std::string> warnings;
  load(std::string(kMinimal) + "parallel: {zero_stage: 1}\n", {}, 1, &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0], "job.yaml:5:24: parallel.zero_stage: ZeRO-1 with one data-parallel rank"));
  warnings.clear();
  const Job tf32 = load(std::string(kMinimal) + "precision: {tf32: true}\n", {}, 1, &warnings);
  CHECK(tf32.precision.tf32);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0], "precision.tf32: TF32 is a CUDA tensor-core mode"));
  warnings.clear();
  load(std::string(kMinimal) + "precision: {tf32: true}\ndevice: cuda\n", {}, 1, &warnings);
  CHECK(warnings.empty());
  const Job scaled = load(std::string(kMinimal) +
                              "precision: {loss_scale: {mode: dynamic, hysteresis: 2, "
                              "on_min: clamp}}\n",
                          {}, 1, &warnings);
  CHECK(scaled.precision.loss_scale.mode == LossScaleMode::dynamic);
  CHECK(scaled.precision.loss_scale.hysteresis == 2);
  CHECK(scaled.precision.loss_scale.on_min == LossScaleOnMin::clamp);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0], "precision.loss_scale.mode: dynamic loss scaling with dtype fp32"));
  warnings.clear();
  load(std::string(kMinimal) + "precision: {master_weights: false}\n", {}, 1, &warnings);
  REQUIRE(warnings.size() == 1);  // fp32: nothing to keep apart, so the key does nothing
  CHECK(has(warnings[0], "precision.master_weights: false has no effect with dtype fp32"));
  warnings.clear();
  const Job in_place =
      load(std::string(kMinimal) + "precision: {dtype: fp16, master_weights: false}\n", {}, 1,
           &warnings);
  CHECK_FALSE(in_place.precision.master_weights);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0],
            "precision.master_weights: false: the fp16 parameters are updated in place"));
}

TEST_CASE("empty documents and non-mapping roots") {
  CHECK(has(error_of(""), "job.yaml: the job file is empty"));
  CHECK(has(error_of("# only a comment\n\n"), "the job file is empty"));
  CHECK(has(error_of("[1, 2]\n"), "job.yaml:1:1: expected a mapping at the top level, got a list"));
}

TEST_CASE("file limits: missing, directory, too big") {
  namespace fs = std::filesystem;
  ValidateContext ctx;
  const fs::path dir = fs::temp_directory_path() / "dtrain_test_config";
  fs::create_directories(dir);
  auto error_for = [&](const std::string& path) {
    try {
      load_job_file(path, {}, ctx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  CHECK(has(error_for((dir / "missing.yaml").string()), "missing.yaml: job file not found"));
  CHECK(has(error_for(dir.string()), "is a directory"));
  const fs::path big = dir / "big.yaml";
  {
    std::ofstream out(big);
    out << kMinimal << "# " << std::string(kMaxFileBytes, 'x') << "\n";
  }
  CHECK(has(error_for(big.string()), "more than the 1048576 allowed"));
  CHECK(has(error_of(std::string(kMaxFileBytes + 1, ' ')), "more than the 1048576 allowed"));
  fs::remove_all(dir);
}

TEST_CASE("dump lists every key in schema order and loads back to the same dump") {
  const std::string first = dump_job_yaml(load(kMinimal));
  CHECK(first.rfind("run:\n  name: \"dtrain\"\n", 0) == 0);
  CHECK(has(first, "\ndevice: cpu\nlogging:\n"));
  CHECK(has(first, "  loss_scale:\n    mode: none\n    init: 32768\n"));
  CHECK(dump_job_yaml(load(first)) == first);
  // Strings that look like other types stay strings.
  const Job odd = load(std::string(kMinimal) + "run: {name: \"true\", output_dir: \"1e3\"}\n");
  const std::string text = dump_job_yaml(odd);
  CHECK(has(text, "name: \"true\""));
  CHECK(load(text).run.output_dir == "1e3");
}

TEST_CASE("the example job files validate and round-trip") {
  namespace fs = std::filesystem;
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(DTRAIN_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    CAPTURE(entry.path().string());
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int world = 1;
    if (auto at = text.find("# validate: --world "); at != std::string::npos)
      world = std::stoi(text.substr(at + 20));
    const std::string first = dump_job_yaml(load(text, {}, world));
    CHECK(dump_job_yaml(load(first, {}, world)) == first);
    ++seen;
  }
  CHECK(seen >= 3);
}
