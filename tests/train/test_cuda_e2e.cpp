// `dtrain train` with device: cuda, end to end through the CLI (ctest train.cuda,
// label gpu): 20 steps of a small-stem ResNet-18, BERT-tiny (masked LM) and
// GPT-2-tiny (causal LM) on synthetic data (the GPU machine has no datasets) must
// log the CPU's losses within a stated tolerance, same seed and data; a CUDA run
// split at a checkpoint and resumed must match the CUDA run done in one go bit for
// bit (every CUDA kernel of dtrain is deterministic); and a CPU checkpoint must
// resume on the GPU; bf16 and fp16 runs follow the CPU's in the same precision.
// `dtrain generate` on CUDA (the key/value cache's steps too) draws the CPU's tokens from
// the same checkpoint; `dtrain predict` on CUDA gives the CPU's classes, fill-mask and
// scores.
// Without a usable CUDA device it prints "skipped: no GPU
// (<reason>)" and exits 77 (SKIP_RETURN_CODE).
//
// Tolerance: the two backends sum in different orders (cuBLASLt and cuDNN tiles,
// block reductions), so f32 rounding differs from the first op on. Step 1 (same
// initial weights, same batch) must agree to 1e-4 relative; every one of the 20 to
// 2e-2 relative, which leaves room for the differences to grow through training
// and still catches any wrong kernel (a wrong gradient moves the loss by far more
// within a few steps). TF32 is off (precision.tf32 defaults to false), so this is f32
// vs f32; a TF32 run (ResNet-18: cuDNN convolutions and cuBLASLt GEMMs) is held to
// 5e-2 relative, TF32 keeping 10 mantissa bits of each product's inputs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "corpus.h"
#include "harness.h"
#include "kernels/device_info.h"

using namespace dtrain::train_test;

namespace {

struct Model {
  const char* name;
  const char* yaml;  // model, data and optimizer sections
};

const Model kModels[] = {
    {"resnet18",
     "model: {arch: resnet18, stem: small, width: 0.25, image_size: 32, in_channels: 3,\n"
     "        num_classes: 10}\n"
     "data: {dataset: synthetic, global_batch: 32, workers: 1, limit: {test: 64}}\n"
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 5.0e-4}\n"},
    {"bert-tiny",
     "model: {arch: bert-tiny, seq_len: 32}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01}\n"},
    {"gpt2-tiny",
     "model: {arch: gpt2-tiny, seq_len: 32}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
     "optimizer: {name: lamb, lr: 1.0e-3, weight_decay: 0.01}\n"},
    // Padded texts: the padding mask's kernel and attention's key mask on the device.
    {"bert-tiny-classifier",
     "model: {arch: bert-tiny, seq_len: 32, num_classes: 3}\n"
     "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01}\n"},
};

fs::path write_model_job(const fs::path& dir, const std::string& run, const Model& m) {
  const fs::path job = dir / (run + ".yaml");
  std::ofstream(job) << "run: {output_dir: " << (dir / run).string() << ", seed: 7}\n"
                     << m.yaml << "train: {steps: 20, log_every: 1}\n"
                     << "logging: {console: false}\n";
  return job;
}

std::vector<StepLoss> train(const fs::path& job, const fs::path& dir, const std::string& device,
                            std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {job.string(), "--set", "device=" + device};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_dtrain(args, dir / (job.stem().string() + "-" + device + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return read_losses(job.parent_path() / job.stem() / "metrics.jsonl");
}

void check_close(const std::vector<StepLoss>& cpu, const std::vector<StepLoss>& gpu,
                 double first = 1e-4, double rest = 2e-2) {
  REQUIRE(cpu.size() == gpu.size());
  CHECK_MESSAGE(first_far(cpu, gpu, first, rest) == "", first_far(cpu, gpu, first, rest));
}

}  // namespace

TEST_CASE("20 steps on CUDA match the CPU's losses") {
  for (const Model& m : kModels) {
    CAPTURE(m.name);
    TempDir tmp(std::string("cuda-e2e-") + m.name);
    const auto cpu = train(write_model_job(tmp.path(), "cpu", m), tmp.path(), "cpu");
    const auto gpu = train(write_model_job(tmp.path(), "gpu", m), tmp.path(), "cuda");
    REQUIRE(cpu.size() == 20);
    check_close(cpu, gpu);
    // The loss must also move: a run that never updates would match step 1 and fail here.
    CHECK(std::abs(gpu.back().loss - gpu.front().loss) > 1e-3);
  }
}

// bf16 and fp16 (fp32 master weights; fp16 with the dynamic loss scaler) on both
// backends: the same policy stores the same tensors in half, but each backend rounds
// its own f32 sums to half, so the two drift by a few half units per op. Step 1 within
// 2e-2 relative, all 20 steps within 5e-2 (bf16 keeps 8 mantissa bits, 2^-9 relative
// per rounding; fp16 10). A wrong half kernel moves the loss by far more.
TEST_CASE("bf16 and fp16 on CUDA follow the CPU's losses in the same precision") {
  for (const char* dtype : {"bf16", "fp16"}) {
    for (const Model& m : kModels) {
      CAPTURE(dtype);
      CAPTURE(m.name);
      TempDir tmp(std::string("cuda-half-") + dtype + "-" + m.name);
      const std::vector<std::string> half = {"--set", std::string("precision.dtype=") + dtype};
      const auto cpu = train(write_model_job(tmp.path(), "cpu", m), tmp.path(), "cpu", half);
      const auto gpu = train(write_model_job(tmp.path(), "gpu", m), tmp.path(), "cuda", half);
      REQUIRE(cpu.size() == 20);
      check_close(cpu, gpu, 2e-2, 5e-2);
      CHECK(std::abs(gpu.back().loss - gpu.front().loss) > 1e-3);
    }
  }
}

TEST_CASE("precision.tf32 trains a ResNet-18 close to the CPU's f32 losses") {
  const Model& m = kModels[0];
  TempDir tmp("cuda-tf32");
  const auto cpu = train(write_model_job(tmp.path(), "cpu", m), tmp.path(), "cpu");
  const auto tf32 = train(write_model_job(tmp.path(), "tf32", m), tmp.path(), "cuda",
                          {"--set", "precision.tf32=true"});
  check_close(cpu, tf32, 5e-2, 5e-2);
}

// optimizer.ema on CUDA (the ema_update kernel, the exchange for evaluations through
// device copies): the losses and the evaluations of the average follow the CPU's.
TEST_CASE("optimizer.ema on CUDA: the average's evaluations follow the CPU's") {
  const Model& m = kModels[0];
  TempDir tmp("cuda-ema");
  const std::vector<std::string> ema = {"--set", "optimizer.ema.decay=0.9", "--set",
                                        "train.eval_every=10"};
  const auto cpu = train(write_model_job(tmp.path(), "cpu", m), tmp.path(), "cpu", ema);
  const auto gpu = train(write_model_job(tmp.path(), "gpu", m), tmp.path(), "cuda", ema);
  check_close(cpu, gpu);
  const nlohmann::json ec = last_eval(tmp.path() / "cpu" / "metrics.jsonl"),
                       eg = last_eval(tmp.path() / "gpu" / "metrics.jsonl");
  REQUIRE(!eg.is_null());
  CHECK(eg.at("weights") == "ema");
  const double lc = ec.at("test_loss"), lg = eg.at("test_loss");
  CHECK(std::abs(lg - lc) <= 2e-2 * std::abs(lc));
}

TEST_CASE("a CUDA run resumed from its checkpoint repeats the straight run bit for bit") {
  for (const Model& m : kModels) {
    CAPTURE(m.name);
    TempDir tmp(std::string("cuda-resume-") + m.name);
    const auto whole = train(write_model_job(tmp.path(), "whole", m), tmp.path(), "cuda");
    const fs::path split = write_model_job(tmp.path(), "split", m);
    train(split, tmp.path(), "cuda", {"--set", "train.steps=10"});
    const auto resumed = train(split, tmp.path(), "cuda", {"--resume", "latest"});
    CHECK_MESSAGE(first_difference(whole, resumed) == "", first_difference(whole, resumed));
  }
}

// The NCCL path at world 1 (the only NCCL layout one GPU allows): gradients and
// batch-norm buffers go through a one-rank NCCL communicator, whose all-reduce of one
// addend is exact, so every algorithm repeats the self communicator's run bit for bit.
TEST_CASE("gradients through a one-rank NCCL communicator repeat the plain CUDA run exactly") {
  for (const Model& m : {kModels[0], kModels[2]}) {
    CAPTURE(m.name);
    TempDir tmp(std::string("cuda-nccl-") + m.name);
    const auto plain = train(write_model_job(tmp.path(), "plain", m), tmp.path(), "cuda");
    for (const char* algo : {"native", "ring", "hierarchical"}) {
      CAPTURE(algo);
      const auto nccl =
          train(write_model_job(tmp.path(), std::string("nccl-") + algo, m), tmp.path(), "cuda",
                {"--set", "comm.backend=nccl", "--set", std::string("comm.allreduce=") + algo,
                 "--set", "comm.bucket_mb=0.05"});
      CHECK_MESSAGE(first_difference(plain, nccl) == "", first_difference(plain, nccl));
    }
  }
}

TEST_CASE("a checkpoint written on the CPU resumes on CUDA") {
  const Model& m = kModels[1];
  TempDir tmp("cuda-cross-resume");
  const auto cpu = train(write_model_job(tmp.path(), "cpu", m), tmp.path(), "cpu");
  const fs::path split = write_model_job(tmp.path(), "split", m);
  train(split, tmp.path(), "cpu", {"--set", "train.steps=10"});
  const auto resumed = train(split, tmp.path(), "cuda", {"--resume", "latest"});
  check_close(cpu, resumed);
}

// memory.offload.optimizer: the optimizer runs on the host (the CPU backend's fused
// kernels) from downloaded gradients, and the parameters are uploaded after each step.
// The losses follow the CPU's in the same precision, a split run resumes bit for bit,
// and the device's measured peak falls below the plain CUDA run's (the masters and the
// optimizer state are on the host). memory.pool: false (cudaMalloc per tensor) changes
// no arithmetic, so it repeats the pooled run exactly.

TEST_CASE("optimizer offload on CUDA follows the CPU, resumes exactly and frees device memory") {
  const std::pair<const Model*, const char*> cases[] = {
      {&kModels[0], "fp32"}, {&kModels[1], "bf16"}, {&kModels[2], "bf16"}};
  for (const auto& [m, dtype] : cases) {
    CAPTURE(m->name);
    CAPTURE(dtype);
    TempDir tmp(std::string("cuda-offload-") + m->name);
    const std::vector<std::string> precision = {"--set", std::string("precision.dtype=") + dtype};
    std::vector<std::string> offload = precision;
    offload.insert(offload.end(), {"--set", "memory.offload.optimizer=true"});
    const auto cpu = train(write_model_job(tmp.path(), "cpu", *m), tmp.path(), "cpu", precision);
    const auto plain =
        train(write_model_job(tmp.path(), "plain", *m), tmp.path(), "cuda", precision);
    const auto off = train(write_model_job(tmp.path(), "off", *m), tmp.path(), "cuda", offload);
    REQUIRE(off.size() == 20);
    if (std::string(dtype) == "fp32") {
      check_close(cpu, off);
    } else {
      check_close(cpu, off, 2e-2, 5e-2);
    }
    CHECK(summary_value(tmp.path() / "off", "peak_device_bytes") <
          summary_value(tmp.path() / "plain", "peak_device_bytes"));
    const fs::path split = write_model_job(tmp.path(), "split", *m);
    std::vector<std::string> first = offload;
    first.insert(first.end(), {"--set", "train.steps=10"});
    train(split, tmp.path(), "cuda", first);
    std::vector<std::string> rest = offload;
    rest.insert(rest.end(), {"--resume", "latest"});
    const auto resumed = train(split, tmp.path(), "cuda", rest);
    CHECK_MESSAGE(first_difference(off, resumed) == "", first_difference(off, resumed));
  }
}

TEST_CASE("memory.pool: false on CUDA repeats the pooled run bit for bit") {
  const Model& m = kModels[2];
  TempDir tmp("cuda-no-pool");
  const auto pooled = train(write_model_job(tmp.path(), "pooled", m), tmp.path(), "cuda");
  const auto plain = train(write_model_job(tmp.path(), "plain", m), tmp.path(), "cuda",
                           {"--set", "memory.pool=false"});
  CHECK_MESSAGE(first_difference(pooled, plain) == "", first_difference(pooled, plain));
}

// dtrain generate on CUDA reads the CPU run's checkpoint and draws the same tokens with
// the same log-probabilities (to 1e-4): the same Philox draws pick the same token unless
// a draw falls within the two backends' rounding of a boundary between two tokens.
TEST_CASE("generate on CUDA draws the CPU's tokens with the CPU's log-probabilities") {
  const Model& m = kModels[2];
  TempDir tmp("cuda-generate");
  const fs::path job = write_model_job(tmp.path(), "cpu", m);
  train(job, tmp.path(), "cpu", {"--set", "train.checkpoint.every=20"});
  const TokenDir tok = tokenize(tmp.path(), 200);  // the synthetic job has no tokenizer
  // 40 tokens after a prompt of about 10 pass the 32-token context: cached steps, then
  // forwards over the sliding window; and once without the cache.
  const auto run = [&](const std::string& device, bool cache) {
    std::vector<std::string> args = {"generate",     job.string(),
                                     "--tokenizer",  (tok.dir / "tokenizer.json").string(),
                                     "--prompt",     "The old king",
                                     "--tokens",     "40",
                                     "--samples",    "2",
                                     "--ignore-end", "--device",
                                     device,         "--json"};
    if (!cache) args.push_back("--no-cache");
    const RunResult r = run_dtrain_command(
        args, tmp.path() / ("generate-" + device + (cache ? "" : "-no-cache") + ".log"));
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    return nlohmann::json::parse(r.log.substr(r.log.find("{\n")));
  };
  const nlohmann::json cpu = run("cpu", true);
  REQUIRE(cpu.at("samples").size() == 2);
  for (const bool cache : {true, false}) {
    CAPTURE(cache);
    const nlohmann::json gpu = run("cuda", cache);
    const int64_t prompt = static_cast<int64_t>(gpu.at("prompt_ids").size());
    CHECK(gpu.at("cached_steps") == (cache ? 32 - prompt : 0));  // the cache ran on the device
    CHECK(gpu.at("forwards") == (cache ? 40 - (32 - prompt) : 40));
    for (size_t s = 0; s < 2; ++s) {
      const nlohmann::json& a = cpu.at("samples")[s];
      const nlohmann::json& b = gpu.at("samples")[s];
      CHECK(a.at("ids") == b.at("ids"));
      for (size_t k = 0; k < a.at("logprobs").size(); ++k) {
        CHECK(a.at("logprobs")[k].get<double>() ==
              doctest::Approx(b.at("logprobs")[k].get<double>()).epsilon(1e-4));
      }
    }
  }
}

// dtrain predict on CUDA reads the CPU runs' checkpoints: a classifier's probabilities
// (padded rows: the key mask on the device), a masked-LM's fill-mask (two [MASK]s in
// one text: the head's gather) and a GPT-2's scores (a text past the 32-token context:
// strided windows) are the CPU's to 1e-4.
TEST_CASE("predict on CUDA gives the CPU's classes, fill-mask and scores") {
  TempDir tmp("cuda-predict");
  const TokenDir tok = tokenize(tmp.path(), 200);  // the synthetic jobs have no tokenizer
  const std::string story =
      "The old king sees the farmer near the house. A horse walked in the garden. The farmer "
      "sees a horse, and the old king walked to the river.";
  for (const Model* m : {&kModels[3], &kModels[1], &kModels[2]}) {
    CAPTURE(m->name);
    const fs::path job = write_model_job(tmp.path(), m->name, *m);
    train(job, tmp.path(), "cpu", {"--set", "train.checkpoint.every=20"});
    const bool classify = m == &kModels[3], score = m == &kModels[2];
    const std::string first = classify ? "The old king sees the farmer."
                              : score  ? story
                                       : "The [MASK] king [MASK].";
    const std::string second = classify || score ? "Who?" : "A [MASK] walked in the garden.";
    const auto run = [&](const std::string& device) {
      std::vector<std::string> args = {
          "predict",  job.string(), "--tokenizer", (tok.dir / "tokenizer.json").string(),
          "--text",   first,        "--text",      second,
          "--device", device,       "--json"};
      const RunResult r = run_dtrain_command(args, tmp.path() / ("predict-" + device + ".log"));
      REQUIRE_MESSAGE(r.rc == 0, r.describe());
      return nlohmann::json::parse(r.log.substr(r.log.find("{\n")));
    };
    const nlohmann::json cpu = run("cpu"), gpu = run("cuda");
    REQUIRE(cpu.at("texts").size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      const nlohmann::json& a = cpu.at("texts")[i];
      const nlohmann::json& b = gpu.at("texts")[i];
      if (score) {
        CHECK(a.at("windows") == b.at("windows"));
        REQUIRE(a.at("logprobs").size() == b.at("logprobs").size());
        for (size_t k = 0; k < a.at("logprobs").size(); ++k) {
          CHECK(a.at("logprobs")[k].get<double>() ==
                doctest::Approx(b.at("logprobs")[k].get<double>()).epsilon(1e-4));
        }
        continue;
      }
      if (classify) {
        CHECK(a.at("label") == b.at("label"));
        for (size_t k = 0; k < a.at("probabilities").size(); ++k) {
          CHECK(a.at("probabilities")[k].get<double>() ==
                doctest::Approx(b.at("probabilities")[k].get<double>()).epsilon(1e-4));
        }
        continue;
      }
      // The listed probabilities agree rank for rank; the ids too, unless the CPU's
      // next rank is within the tolerance (20 steps on uniform tokens leave near-ties).
      REQUIRE(a.at("masks").size() == b.at("masks").size());
      for (size_t k = 0; k < a.at("masks").size(); ++k) {
        const nlohmann::json& x = a.at("masks")[k];
        const nlohmann::json& y = b.at("masks")[k];
        REQUIRE(x.size() == y.size());
        for (size_t j = 0; j < x.size(); ++j) {
          const double p = x[j].at("probability").get<double>();
          CHECK(p == doctest::Approx(y[j].at("probability").get<double>()).epsilon(1e-4));
          const bool tie =
              j + 1 < x.size() && p - x[j + 1].at("probability").get<double>() < 1e-4 * p;
          if (!tie && (j == 0 || p - x[j - 1].at("probability").get<double>() < -1e-4 * p))
            CHECK(x[j].at("id") == y[j].at("id"));
        }
      }
    }
  }
}

// An image model on CUDA: the test split's accuracy and every image's probabilities
// (batch norm's running statistics on the device) are the CPU's, from the CPU's checkpoint.
TEST_CASE("predict on CUDA classifies the CPU's test split as the CPU does") {
  TempDir tmp("cuda-predict-image");
  const fs::path job = write_job(tmp.path(), "run");  // a small ResNet on Fashion-MNIST
  const RunResult t = run_dtrain({job.string()}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(t.rc == 0, t.describe());
  const auto run = [&](const std::string& device) {
    const RunResult r = run_dtrain_command(
        {"predict", job.string(), "--split", "test", "--device", device, "--json"},
        tmp.path() / ("predict-" + device + ".log"));
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    return nlohmann::json::parse(r.log.substr(r.log.find("{\n")));
  };
  const nlohmann::json cpu = run("cpu"), gpu = run("cuda");
  CHECK(cpu.at("accuracy") == gpu.at("accuracy"));
  REQUIRE(cpu.at("images").size() == gpu.at("images").size());
  for (size_t i = 0; i < cpu.at("images").size(); ++i) {
    const nlohmann::json& a = cpu.at("images")[i].at("probabilities");
    const nlohmann::json& b = gpu.at("images")[i].at("probabilities");
    for (size_t k = 0; k < a.size(); ++k)
      CHECK(a[k].get<double>() == doctest::Approx(b[k].get<double>()).epsilon(1e-4));
  }
}

int main(int argc, char** argv) {
  const dtrain::kernels::CudaInfo info = dtrain::kernels::query_cuda();
  if (!info.available) {
    std::printf("skipped: no GPU (%s)\n", info.reason.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
