// memory.offload.optimizer end to end on the CPU. Offload is a GPU feature (validation
// refuses it with device: cpu); DTRAIN_TEST_OFFLOAD_ON_CPU=1 lets the tests run the same
// code here, where the downloads and uploads are memcpys between two host buffers. The
// step runs the CPU backend's fused kernels either way, so an offloaded run must repeat
// the plain run bit for bit, resume bit for bit, and dtrain estimate (which counts the
// host side separately, and on the CPU adds it to the peak) must give its measured
// peak. The GPU's own check is tests/train/test_cuda_e2e.cpp (label gpu).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

struct OffloadOnCpu {
  OffloadOnCpu() { setenv("DTRAIN_TEST_OFFLOAD_ON_CPU", "1", 1); }
  ~OffloadOnCpu() { unsetenv("DTRAIN_TEST_OFFLOAD_ON_CPU"); }
};

fs::path gpt_job(const fs::path& dir) {
  const fs::path job = dir / "gpt.yaml";
  std::ofstream(job) << "run: {seed: 5}\n"
                     << "model: {arch: gpt2-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 16, "
                        "vocab_size: 256, dropout: 0.1}\n"
                     << "data: {dataset: synthetic, global_batch: 8, limit: {test: 8}}\n"
                     << "optimizer: {name: adamw, lr: 1.0e-3, clip_grad_norm: 1.0}\n"
                     << "train: {steps: 6, log_every: 1, checkpoint: {every: 3}}\n"
                     << "logging: {console: false}\n";
  return job;
}

fs::path train(const fs::path& job, const fs::path& dir, const std::string& name,
               std::vector<std::string> extra) {
  std::vector<std::string> args = {job.string(), "--set",
                                   "run.output_dir=" + (dir / name).string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_dtrain(args, dir / (name + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return dir / name;
}

}  // namespace

TEST_CASE("optimizer offload repeats the plain run bit for bit, resumes, and is estimated") {
  OffloadOnCpu allow;
  TempDir tmp("offload");
  const fs::path job = gpt_job(tmp.path());
  for (const char* dtype : {"fp32", "bf16"}) {
    CAPTURE(dtype);
    const std::vector<std::string> precision = {"--set", std::string("precision.dtype=") + dtype};
    std::vector<std::string> offload = precision;
    offload.insert(offload.end(), {"--set", "memory.offload.optimizer=true"});
    const fs::path plain = train(job, tmp.path(), std::string("plain-") + dtype, precision);
    const fs::path off = train(job, tmp.path(), std::string("off-") + dtype, offload);
    const auto plain_losses = read_losses(plain / "metrics.jsonl");
    REQUIRE(plain_losses.size() == 6);
    CHECK(first_difference(plain_losses, read_losses(off / "metrics.jsonl")) == "");
    CHECK(compare_checkpoints(newest_checkpoint(plain / "checkpoints"),
                              newest_checkpoint(off / "checkpoints")) == "");
    // Split at step 3 and resumed, offloaded: the same run.
    std::vector<std::string> first = offload;
    first.insert(first.end(), {"--set", "train.steps=3"});
    const fs::path split = train(job, tmp.path(), std::string("split-") + dtype, first);
    std::vector<std::string> rest = offload;
    rest.insert(rest.end(), {"--resume", "latest"});
    train(job, tmp.path(), std::string("split-") + dtype, rest);
    CHECK(first_difference(plain_losses, read_losses(split / "metrics.jsonl")) == "");
    // The estimate: the host side is listed apart, and on the CPU it is the same memory.
    std::vector<std::string> est = {"estimate", job.string(), "--json"};
    est.insert(est.end(), offload.begin(), offload.end());
    const RunResult r = run_dtrain_command(est, tmp.path() / (std::string("est-") + dtype));
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    const nlohmann::json e = nlohmann::json::parse(r.log.substr(r.log.find('{')));
    CHECK(e.at("host_bytes").get<double>() > 0);
    const double estimated = e.at("peak_bytes").get<double>(),
                 measured = summary_value(off, "peak_host_bytes");
    CHECK_MESSAGE(std::fabs(estimated / measured - 1) < 0.03, estimated, " vs ", measured);
  }
}
