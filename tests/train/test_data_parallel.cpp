// Data parallelism end to end: `dtrain train --nproc N` (mpirun under the hood)
// against one rank with N micro-batches of the same global batch. Two ranks must
// match bit for bit (losses and the final checkpoint) for a batch-norm ResNet,
// GPT-2 with dropout and BERT masked LM (label counts differ per micro-batch), with
// each all-reduce algorithm; four ranks within 1e-5 and bitwise run to run;
// checkpoints resume across layouts; bad layouts exit 2 with one message.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "corpus.h"
#include "harness.h"

using namespace dtrain::train_test;

namespace {

constexpr int kSeqLen = 16;

struct Layout {
  int ranks = 1;
  std::string algo = "native";
};

// The whole run at `dir/name`, every step logged; REQUIREs success.
fs::path train(const fs::path& job, const fs::path& dir, const std::string& name, const Layout& l,
               std::vector<std::string> extra) {
  const fs::path out = dir / name;
  std::vector<std::string> args = {job.string(), "--set", "run.output_dir=" + out.string(), "--set",
                                   "comm.allreduce=" + l.algo};
  if (l.ranks > 1) args.insert(args.end(), {"--nproc", std::to_string(l.ranks)});
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_dtrain(args, dir / (name + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return out;
}

void require_same(const fs::path& a, const fs::path& b) {
  const auto la = read_losses(a / "metrics.jsonl"), lb = read_losses(b / "metrics.jsonl");
  REQUIRE(!la.empty());
  CHECK_MESSAGE(first_difference(la, lb).empty(), a.filename().string(), " vs ",
                b.filename().string(), ": ", first_difference(la, lb));
  CHECK(compare_checkpoints(newest_checkpoint(a / "checkpoints"),
                            newest_checkpoint(b / "checkpoints")) == "");
}

double max_relative(const std::vector<StepLoss>& a, const std::vector<StepLoss>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(a[i].loss - b[i].loss) / std::fabs(b[i].loss));
  return worst;
}

// A one-layer width-32 transformer on the generated corpus; short documents and a
// high masking rate make the masked-token count differ from window to window.
fs::path lm_job(const fs::path& dir, const std::string& arch, const TokenDir& t) {
  const fs::path job = dir / (arch + ".yaml");
  std::ofstream(job) << "run: {seed: 3}\n"
                     << "model: {arch: " << arch << ", layers: 1, hidden: 32, heads: 2,\n"
                     << "        seq_len: " << kSeqLen << ", max_positions: " << kSeqLen
                     << ", vocab_size: " << t.vocab << ", dropout: 0.1}\n"
                     << "data: {dataset: tokens, path: " << t.dir.string()
                     << ", global_batch: 8, micro_batch: 4, mlm_probability: 0.9,"
                     << " limit: {test: 8}}\n"
                     << "optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}\n"
                     << "train: {steps: 6, log_every: 1}\n"
                     << "comm: {bucket_mb: 0.005}\n"
                     << "logging: {console: false}\n";
  return job;
}

struct OneThread {  // bitwise comparisons need the same kernels' thread split
  OneThread() { setenv("OMP_NUM_THREADS", "1", 1); }
};

}  // namespace

TEST_CASE("2 ranks train exactly like 1 rank with 2 micro-batches, with every algorithm") {
  OneThread one;
  TempDir tmp("dp2");
  const TokenDir tokens = tokenize(tmp.path(), 300);
  struct Model {
    const char* name;
    fs::path job;
    std::vector<std::string> extra;
  };
  const std::vector<Model> models = {
      {"resnet",
       write_job(tmp.path(), "resnet"),
       {"--set", "data.micro_batch=16", "--set", "train.steps=4", "--set", "comm.bucket_mb=0.02"}},
      {"gpt2", lm_job(tmp.path(), "gpt2-tiny", tokens), {}},
      {"bert", lm_job(tmp.path(), "bert-mini", tokens), {}},
  };
  for (const Model& m : models) {
    CAPTURE(m.name);
    const fs::path one_rank = train(m.job, tmp.path(), std::string(m.name) + "-1x2", {}, m.extra);
    for (const char* algo : {"native", "ring", "hierarchical"}) {
      CAPTURE(algo);
      std::vector<std::string> extra = m.extra;
      if (std::string(algo) == "hierarchical")
        extra.insert(extra.end(), {"--set", "comm.ranks_per_node=1"});
      const fs::path two =
          train(m.job, tmp.path(), std::string(m.name) + "-2-" + algo, {2, algo}, extra);
      require_same(one_rank, two);
    }
  }
}

TEST_CASE("4 ranks stay within 1e-5 of 1 rank x 4 micro-batches and repeat bit for bit") {
  OneThread one;
  TempDir tmp("dp4");
  const TokenDir tokens = tokenize(tmp.path(), 300);
  const fs::path job = lm_job(tmp.path(), "gpt2-tiny", tokens);
  const std::vector<std::string> extra = {
      "--set", "data.global_batch=8", "--set", "data.micro_batch=2", "--set", "train.steps=20"};
  const fs::path ref = train(job, tmp.path(), "1x4", {}, extra);
  const auto ref_losses = read_losses(ref / "metrics.jsonl");
  for (const char* algo : {"native", "ring", "hierarchical"}) {
    CAPTURE(algo);
    std::vector<std::string> args = extra;  // two emulated nodes of two ranks
    if (std::string(algo) == "hierarchical")
      args.insert(args.end(), {"--set", "comm.ranks_per_node=2"});
    const fs::path a = train(job, tmp.path(), std::string("4-") + algo + "-a", {4, algo}, args);
    const fs::path b = train(job, tmp.path(), std::string("4-") + algo + "-b", {4, algo}, args);
    CHECK(max_relative(read_losses(a / "metrics.jsonl"), ref_losses) < 1e-5);
    require_same(a, b);
  }
}

TEST_CASE("a checkpoint resumes across layouts: 2 ranks <-> 1 rank x 2 micro-batches") {
  OneThread one;
  TempDir tmp("dpresume");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> base = {"--set", "data.micro_batch=16",
                                         "--set", "train.steps=6",
                                         "--set", "train.checkpoint.every=3"};
  const fs::path whole = train(job, tmp.path(), "whole-2", {2, "ring"}, base);
  for (const Layout& first : {Layout{2, "ring"}, Layout{1, "native"}}) {
    const Layout second = first.ranks == 2 ? Layout{1, "native"} : Layout{2, "ring"};
    CAPTURE(first.ranks);
    const std::string name = "resumed-from-" + std::to_string(first.ranks);
    std::vector<std::string> half = base;
    half.insert(half.end(), {"--set", "train.steps=3"});
    const fs::path out = train(job, tmp.path(), name, first, half);
    std::vector<std::string> rest = base;
    rest.insert(rest.end(), {"--resume", "latest"});
    train(job, tmp.path(), name, second, rest);
    CHECK(compare_checkpoints(newest_checkpoint(out / "checkpoints"),
                              newest_checkpoint(whole / "checkpoints")) == "");
    const auto losses = read_losses(out / "metrics.jsonl");
    CHECK(first_difference(losses, read_losses(whole / "metrics.jsonl")) == "");
  }
}

TEST_CASE("a data-parallel run logs per rank and reports its communication") {
  OneThread one;
  TempDir tmp("dplogs");
  const fs::path job = write_job(tmp.path(), "resnet");
  const fs::path out = train(job, tmp.path(), "run", {2, "ring"},
                             {"--set", "data.micro_batch=16", "--set", "train.steps=2"});
  CHECK(fs::exists(out / "logs" / "rank-0.log"));
  CHECK(fs::exists(out / "logs" / "rank-1.log"));
  std::string line;
  std::ifstream in(out / "metrics.jsonl");
  std::getline(in, line);
  const nlohmann::json first = nlohmann::json::parse(line);
  CHECK(first.at("comm_bytes").get<int64_t>() > 0);
  CHECK(first.at("allreduce").get<std::string>() == "ring");
  CHECK(first.at("exposed_comm_s").get<double>() >= 0);
}

TEST_CASE("bad data-parallel layouts exit 2 on every rank with one message") {
  OneThread one;
  TempDir tmp("dpbad");
  const fs::path job = write_job(tmp.path(), "resnet");
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--set", "parallel.data=3"}, "parallel.data"},
      {{"--set", "data.global_batch=33"}, "data.global_batch"},
      {{"--set", "comm.backend=nccl"}, "comm.backend"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expect);
    std::vector<std::string> args = {job.string(), "--nproc", "2"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dtrain(args, tmp.path() / "bad.log");
    CHECK(r.rc == 2);
    size_t count = 0;
    for (size_t at = r.log.find("error:"); at != std::string::npos;
         at = r.log.find("error:", at + 1))
      ++count;
    CHECK_MESSAGE(count == 1, r.log);
    CHECK_MESSAGE(r.log.find(c.expect) != std::string::npos, r.log);
  }
}
