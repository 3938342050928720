// `dtrain train` on language models, end to end through the CLI: a generated
// English-like corpus is tokenized by the real `dtrain data tokenize`, then a
// one-layer GPT-2 (causal LM) and BERT (masked LM) of width 32 train on it. Checks
// bitwise resume (also across an epoch boundary), that the GPT learns, the
// refusals of unusable token data, and synthetic tokens. Not the tokenizer or
// the batch rules on their own (tests/data/).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "corpus.h"
#include "harness.h"

using namespace dtrain::train_test;

namespace {

constexpr int kExitBadInput = 2;
constexpr int64_t kSeqLen = 16;  // T of every job here
constexpr int64_t kBatch = 4;    // micro batch of every job here

// ---- jobs and metrics --------------------------------------------------------

// A one-layer, width-32 transformer of `arch` (gpt2-tiny or bert-tiny shrunk)
// over the token directory `data` (synthetic tokens when empty), 8 steps of
// micro batch 4, every step logged, at <dir>/<run>.yaml.
fs::path write_lm_job(const fs::path& dir, const std::string& run, const std::string& arch,
                      int64_t vocab, const fs::path& data) {
  const fs::path job = dir / (run + ".yaml");
  const std::string dataset =
      data.empty() ? "dataset: synthetic" : "dataset: tokens, path: " + data.string();
  std::ofstream(job) << "run: {output_dir: " << (dir / run).string() << ", seed: 1}\n"
                     << "model: {arch: " << arch << ", layers: 1, hidden: 32, heads: 2,\n"
                     << "        seq_len: " << kSeqLen << ", max_positions: " << kSeqLen
                     << ", vocab_size: " << vocab << "}\n"
                     << "data: {" << dataset << ", global_batch: " << kBatch
                     << ", micro_batch: " << kBatch << ", limit: {test: 8}}\n"
                     << "optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}\n"
                     << "train: {steps: 8, log_every: 1}\n"
                     << "logging: {console: false}\n";
  return job;
}

std::vector<nlohmann::json> read_lines(const fs::path& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The epoch field of each train line (the epoch of the next batch after that step).
std::vector<int64_t> train_epochs(const fs::path& metrics_jsonl) {
  std::vector<int64_t> out;
  for (const auto& j : read_lines(metrics_jsonl))
    if (j.contains("loss")) out.push_back(j.at("epoch").get<int64_t>());
  return out;
}

// ---- resume ------------------------------------------------------------------

struct LmResumeCase {
  const char* name;
  const char* arch;
  int records;          // corpus size
  int64_t limit_train;  // data.limit.train in windows; 0: the whole shard
  int micro_batches;    // global batch = micro_batches x 4
  std::vector<std::string> extra;
};

bool masked(const LmResumeCase& c) { return std::string(c.arch).starts_with("bert"); }

// Windows are cut at stride T: (n-1)/T causal ones of T+1 tokens, n/T masked ones.
int64_t train_windows(const LmResumeCase& c, const TokenDir& t) {
  if (c.limit_train > 0) return c.limit_train;
  return masked(c) ? t.train_tokens / kSeqLen : (t.train_tokens - 1) / kSeqLen;
}

// Tokens the windows of the whole shard leave over: the range of the per-epoch offset.
int64_t train_slack(const LmResumeCase& c, const TokenDir& t) {
  return masked(c) ? t.train_tokens % kSeqLen : (t.train_tokens - 1) % kSeqLen;
}

std::vector<std::string> lm_args(const fs::path& job, const LmResumeCase& c, int64_t steps) {
  std::vector<std::string> a = {job.string(), "--set", "train.steps=" + std::to_string(steps)};
  if (c.limit_train > 0)
    a.insert(a.end(), {"--set", "data.limit.train=" + std::to_string(c.limit_train)});
  if (c.micro_batches > 1) {
    a.insert(a.end(), {"--set", "data.global_batch=" + std::to_string(kBatch * c.micro_batches)});
  }
  a.insert(a.end(), c.extra.begin(), c.extra.end());
  return a;
}

void check_lm_resume(const LmResumeCase& c) {
  TempDir tmp(std::string("lm-resume-") + c.name);
  const TokenDir t = tokenize(tmp.path(), c.records);
  // Split at the last step that ends inside the first epoch, so that the epoch ends
  // inside the second half. An epoch is whole steps of mb micro-batches: the windows of
  // a partial last step are dropped with it.
  const int64_t steps = train_windows(c, t) / (kBatch * c.micro_batches);
  const int64_t n = steps - 1;
  REQUIRE_MESSAGE((n >= 1 && n <= 16 && 2 * n >= steps), steps << " steps per epoch");
  if (c.limit_train == 0) REQUIRE_MESSAGE(train_slack(c, t) > 0, "no window offset to move");
  const fs::path straight = write_lm_job(tmp.path(), "straight", c.arch, t.vocab, t.dir);
  const fs::path split = write_lm_job(tmp.path(), "split", c.arch, t.vocab, t.dir);

  const RunResult whole = run_dtrain(lm_args(straight, c, 2 * n), tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  const RunResult first = run_dtrain(lm_args(split, c, n), tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  const fs::path split_ckpts = tmp.path() / "split" / "checkpoints";
  REQUIRE(checkpoint_step(newest_checkpoint(split_ckpts)) == n);
  std::vector<std::string> again = lm_args(split, c, 2 * n);
  again.insert(again.end(), {"--resume", "latest"});
  const RunResult second = run_dtrain(again, tmp.path() / "b.log");
  REQUIRE_MESSAGE(second.rc == 0, second.describe());
  CHECK_MESSAGE(contains(second.log, "at step " + std::to_string(n)), second.log);

  const fs::path straight_metrics = tmp.path() / "straight" / "metrics.jsonl";
  const auto expected = read_losses(straight_metrics);
  const auto resumed = read_losses(tmp.path() / "split" / "metrics.jsonl");
  REQUIRE(expected.size() == static_cast<size_t>(2 * n));
  CHECK_MESSAGE(first_difference(expected, resumed) == "", first_difference(expected, resumed));
  const auto epochs = train_epochs(straight_metrics);
  CHECK_MESSAGE(epochs[static_cast<size_t>(n - 1)] == 0, "the split is not in the first epoch");
  CHECK_MESSAGE(epochs.back() >= 1, "no epoch ended in the second half");

  const fs::path a = newest_checkpoint(tmp.path() / "straight" / "checkpoints");
  const fs::path b = newest_checkpoint(split_ckpts);
  REQUIRE(checkpoint_step(a) == 2 * n);
  CHECK_MESSAGE(compare_checkpoints(a, b) == "", compare_checkpoints(a, b));
}

}  // namespace

TEST_CASE("GPT-2 on tokenized text resumes bit for bit across an epoch end") {
  const LmResumeCase cases[] = {
      // 22 windows: 5 batches per epoch, split after step 4 of 8.
      {"gpt2_limit_train", "gpt2-tiny", 300, 22, 1, {}},
      // The whole shard of a small corpus, with tokens left over: each epoch
      // draws its own window offset.
      {"gpt2_whole_shard", "gpt2-tiny", 10, 0, 1, {}},
      // Two micro-batches per step: 22 windows make 2 steps an epoch, the fifth batch of
      // 4 windows dropped with its step (2 ranks would drop it too), split after step 1 of 4.
      {"gpt2_micro2_epoch_of_whole_steps", "gpt2-tiny", 300, 22, 2, {}},
  };
  for (const LmResumeCase& c : cases) {
    SUBCASE(c.name) { check_lm_resume(c); }
  }
}

TEST_CASE("BERT masked LM on tokenized text resumes bit for bit across an epoch end") {
  const LmResumeCase cases[] = {
      {"bert_limit_train", "bert-tiny", 300, 22, 1, {}},
      {"bert_whole_shard_mlm30", "bert-tiny", 10, 0, 1, {"--set", "data.mlm_probability=0.3"}},
  };
  for (const LmResumeCase& c : cases) {
    SUBCASE(c.name) { check_lm_resume(c); }
  }
}

TEST_CASE("a tiny GPT-2 learns the generated text: test loss far below ln(vocab)") {
  TempDir tmp("lm-learning");
  const TokenDir t = tokenize(tmp.path(), 800);
  const fs::path job = write_lm_job(tmp.path(), "run", "gpt2-tiny", t.vocab, t.dir);
  const int64_t test_windows = 64;
  REQUIRE((t.val_tokens - 1) / kSeqLen >= test_windows);
  const RunResult r = run_dtrain(
      {job.string(), "--set", "model.dropout=0", "--set", "data.global_batch=8", "--set",
       "data.micro_batch=8", "--set", "data.limit.test=" + std::to_string(test_windows), "--set",
       "optimizer={name: adamw, lr: 0.005, weight_decay: 0, schedule: {name: cosine, "
       "warmup_steps: 20}}",
       "--set", "train.steps=300", "--set", "train.log_every=50"},
      tmp.path() / "learn.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path metrics = tmp.path() / "run" / "metrics.jsonl";
  const nlohmann::json eval = last_eval(metrics);
  REQUIRE_MESSAGE(eval.contains("test_loss"), "no eval line in " << metrics);
  const double loss = eval.at("test_loss").get<double>();
  const double chance = std::log(static_cast<double>(t.vocab));
  MESSAGE("test loss " << loss << " (ln vocab " << chance << "), token accuracy "
                       << eval.at("test_accuracy").get<double>());
  CHECK(loss < 0.7 * chance);
  // Every label of every evaluated causal window counts: 64 windows x 16 tokens.
  CHECK(eval.at("test_tokens").get<int64_t>() == test_windows * kSeqLen);
  CHECK(eval.at("test_perplexity").get<double>() == doctest::Approx(std::exp(loss)));
  CHECK(eval.at("test_accuracy").get<double>() > 0.2);
  const auto losses = read_losses(metrics);
  REQUIRE(losses.size() == 6);
  CHECK(losses.back().loss < losses.front().loss);
}

TEST_CASE("unusable token data is refused with exit 2, naming the key or file") {
  TempDir tmp("lm-bad-input");
  const TokenDir t = tokenize(tmp.path(), 300);
  const fs::path job = write_lm_job(tmp.path(), "run", "gpt2-tiny", t.vocab, t.dir);
  const fs::path out = tmp.path() / "run";
  const fs::path damaged = tmp.path() / "damaged";
  fs::copy(t.dir, damaged);
  std::string bin = read_bytes(damaged / "train.bin");
  bin[32 + 10] ^= 0x01;  // a payload byte: the header's checksum no longer matches
  write_bytes(damaged / "train.bin", bin);
  struct Case {
    const char* what;
    std::vector<std::string> args;
    std::vector<std::string> names;  // what the message must mention
  };
  const std::string missing = (tmp.path() / "no-such-dir").string();
  const Case cases[] = {
      {"missing data.path directory",
       {"--set", "data.path=" + missing},
       {"error: --set data.path=" + missing + ": data.path: " + missing, "dtrain data tokenize"}},
      {"model.vocab_size below the tokenizer's",
       {"--set", "model.vocab_size=" + std::to_string(t.vocab - 1)},
       {"error: --set model.vocab_size=" + std::to_string(t.vocab - 1) + ": model.vocab_size",
        std::to_string(t.vocab)}},
      {"an image dataset for a GPT",
       {"--set", "data.dataset=fashion-mnist"},
       {"data.dataset: fashion-mnist", "gpt2-tiny"}},
      {"data.limit.train below one batch",
       {"--set", "data.limit.train=3"},
       {"error: " + (t.dir / "train.bin").string() + " cut to 3 windows by data.limit.train",
        "49 tokens make 3 windows", "hint: raise data.limit.train"}},
      {"a flipped payload byte in train.bin",
       {"--set", "data.path=" + damaged.string()},
       {"error: " + (damaged / "train.bin").string(), "checksum"}},
      // The evaluation that ends every run is checked at start-up, not after the training.
      {"val.bin shorter than one window",
       {"--set", "model.seq_len=" + std::to_string(t.val_tokens), "--set",
        "model.max_positions=" + std::to_string(t.val_tokens)},
       {"error: " + (t.dir / "val.bin").string(), "fewer than one window"}},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    std::vector<std::string> args = {job.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dtrain(args, tmp.path() / "bad.log");
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    for (const std::string& name : c.names) CHECK_MESSAGE(contains(r.log, name), r.log);
    CHECK_MESSAGE(!fs::exists(out), out << " was created");
    fs::remove_all(out);
  }
  // The pristine directory still trains: the refusals above are about what each case changed.
  const RunResult ok = run_dtrain({job.string(), "--set", "train.steps=1"}, tmp.path() / "ok.log");
  CHECK_MESSAGE(ok.rc == 0, ok.describe());
}

TEST_CASE("an image model is refused on token data") {
  TempDir tmp("lm-image-arch");
  const TokenDir t = tokenize(tmp.path(), 100);
  const fs::path job = write_job(tmp.path());
  const RunResult r = run_dtrain(
      {job.string(), "--set", "data.dataset=tokens", "--set", "data.path=" + t.dir.string()},
      tmp.path() / "bad.log");
  CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
  CHECK_MESSAGE(contains(r.log, "data.dataset: token"), r.log);
  CHECK_MESSAGE(contains(r.log, "resnet18"), r.log);
}

TEST_CASE("GPT-2 and BERT train on synthetic tokens from chance-level loss") {
  for (const char* arch : {"gpt2-tiny", "bert-tiny"}) {
    SUBCASE(arch) {
      TempDir tmp(std::string("lm-synthetic-") + arch);
      const int64_t vocab = 300;
      const fs::path job = write_lm_job(tmp.path(), "run", arch, vocab, {});
      const RunResult r =
          run_dtrain({job.string(), "--set", "train.steps=4"}, tmp.path() / "s.log");
      REQUIRE_MESSAGE(r.rc == 0, r.describe());
      const fs::path metrics = tmp.path() / "run" / "metrics.jsonl";
      const auto losses = read_losses(metrics);
      REQUIRE(losses.size() == 4);
      // Ids are uniform over vocab - 1 values, and a fresh model predicts almost uniformly.
      const double chance = std::log(static_cast<double>(vocab - 1));
      for (const StepLoss& s : losses) {
        CAPTURE(s.step);
        CHECK(std::isfinite(s.loss));
        CHECK(std::abs(s.loss - chance) < 0.5);
      }
      const nlohmann::json eval = last_eval(metrics);
      REQUIRE_MESSAGE(eval.contains("test_perplexity"), "no eval line in " << metrics);
      CHECK(std::isfinite(eval.at("test_perplexity").get<double>()));
      CHECK(eval.at("test_tokens").get<int64_t>() > 0);
    }
  }
}
