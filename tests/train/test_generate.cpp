// `dtrain generate`: the sampler on its own (runtime::pick_token), then the command
// end to end on a two-layer GPT-2 of width 32 trained for a few steps on the generated
// corpus: its log-probabilities against an independent forward in Python
// (tests/scripts/gpt2_reference.py, Hugging Face's arithmetic in float64), the
// sampling invariants (same seed, same text; a sample does not depend on the others
// beside it), where the weights come from, and its refusals (exit 2).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "corpus.h"
#include "harness.h"
#include "runtime/generate.h"

using namespace dtrain::train_test;
using dtrain::runtime::pick_token;
using dtrain::runtime::SamplingOptions;

namespace {

constexpr int kExitBadInput = 2;
constexpr int64_t kContext = kGptContext;  // model.seq_len of the jobs here
constexpr int kHeads = kGptHeads;

// ---- the sampler -----------------------------------------------------------------

std::vector<int32_t> all_ids(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// How often each id is drawn when u walks a fine grid over [0, 1): the sampler's
// distribution, to 1 / steps.
std::vector<double> frequencies(const std::vector<float>& logits,
                                const std::vector<int32_t>& candidates, const SamplingOptions& o,
                                int steps = 20000) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < steps; ++i) {
    const double u = (i + 0.5) / steps;
    f[static_cast<size_t>(pick_token(logits, candidates, o, u).id)] += 1.0 / steps;
  }
  return f;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature,
                            const std::vector<int32_t>& keep) {
  std::vector<double> p(logits.size(), 0.0);
  double z = 0.0;
  for (int32_t id : keep) z += std::exp(logits[static_cast<size_t>(id)] / temperature);
  for (int32_t id : keep) p[static_cast<size_t>(id)] = std::exp(logits[id] / temperature) / z;
  return p;
}

}  // namespace

TEST_CASE("sampler: greedy, temperature, top-k and top-p draw what they say") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 9.0f};
  // id 5 is the most likely but not a candidate (a padding row of the vocabulary, say).
  const std::vector<int32_t> cand = {0, 1, 2, 3, 4};
  double log_z = 0.0;
  for (float x : logits) log_z += std::exp(static_cast<double>(x));
  log_z = std::log(log_z);

  SamplingOptions greedy;
  greedy.temperature = 0.0;
  for (double u : {0.0, 0.5, 0.999}) {
    const auto p = pick_token(logits, cand, greedy, u);
    CHECK(p.id == 1);  // ties (ids 1 and 3) to the smaller id; 5 is not a candidate
    CHECK(p.logprob == doctest::Approx(3.0 - log_z).epsilon(1e-12));  // over the whole vocabulary
  }

  SamplingOptions plain;  // temperature 1: the model's distribution over the candidates
  std::vector<double> f = frequencies(logits, cand, plain);
  std::vector<double> want = softmax(logits, 1.0, cand);
  for (size_t i = 0; i < logits.size(); ++i) CHECK(f[i] == doctest::Approx(want[i]).epsilon(1e-3));
  CHECK(f[5] == 0.0);

  SamplingOptions hot;
  hot.temperature = 2.5;
  f = frequencies(logits, cand, hot);
  want = softmax(logits, 2.5, cand);
  for (size_t i = 0; i < logits.size(); ++i) CHECK(f[i] == doctest::Approx(want[i]).epsilon(1e-3));

  SamplingOptions top2;  // ids 1 and 3, equally likely
  top2.top_k = 2;
  f = frequencies(logits, cand, top2);
  CHECK(f[1] == doctest::Approx(0.5));
  CHECK(f[3] == doctest::Approx(0.5));
  CHECK(f[0] + f[2] + f[4] == 0.0);

  SamplingOptions nucleus;  // p(1) = p(3) = 0.397, p(2) = 0.146: 0.9 needs all three
  nucleus.top_p = 0.9;
  f = frequencies(logits, cand, nucleus);
  want = softmax(logits, 1.0, {1, 2, 3});
  for (int32_t id : {1, 2, 3}) CHECK(f[id] == doctest::Approx(want[id]).epsilon(1e-3));
  CHECK(f[0] + f[4] == 0.0);
  nucleus.top_p = 0.35;  // the first most likely token alone reaches it: the smaller id of the tie
  f = frequencies(logits, cand, nucleus);
  CHECK(f[1] == doctest::Approx(1.0));

  const std::vector<float> bad = {0.0f, NAN, 1.0f};
  CHECK_THROWS_AS(pick_token(bad, all_ids(3), plain, 0.5), dtrain::RunError);
}

// ---- the command ------------------------------------------------------------------

namespace {

struct Trained {
  TokenDir data;
  fs::path job;
};

Trained train_small(const fs::path& tmp, int steps = 30) {
  Trained t;
  t.data = tokenize(tmp, 300);
  t.job = gpt_job(tmp, "gpt", t.data, steps);
  const RunResult r = run_dtrain({t.job.string()}, tmp / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return t;
}

RunResult generate(const fs::path& tmp, const std::string& log,
                   const std::vector<std::string>& args) {
  std::vector<std::string> all = {"generate"};
  all.insert(all.end(), args.begin(), args.end());
  return run_dtrain_command(all, tmp / log);
}

// `dtrain generate --json ...`: its JSON (the log holds nothing else unless it failed).
nlohmann::json generate_json(const fs::path& tmp, const std::string& log,
                             std::vector<std::string> args) {
  args.push_back("--json");
  const RunResult r = generate(tmp, log, args);
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const size_t at = r.log.find("{\n");
  REQUIRE_MESSAGE(at != std::string::npos, r.log);
  return nlohmann::json::parse(r.log.substr(at));
}

// tests/scripts/gpt2_reference.py on an export and generate's JSON: its exit code, and
// its output into `log`.
int reference_check(const fs::path& model, const fs::path& json, const fs::path& log,
                    int64_t candidates, bool greedy) {
  const std::string cmd = std::string("python3 ") + DTRAIN_SOURCE_DIR +
                          "/tests/scripts/gpt2_reference.py " + model.string() + " " +
                          json.string() + " --heads " + std::to_string(kHeads) + " --context " +
                          std::to_string(kContext) + " --candidates " + std::to_string(candidates) +
                          (greedy ? " --greedy" : "") + " > " + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

}  // namespace

TEST_CASE("generate: every new token's log-probability is an independent GPT-2 forward's") {
  TempDir tmp("generate-reference");
  const Trained t = train_small(tmp.path());
  const fs::path model = tmp.path() / "gpt.safetensors";
  const RunResult e = run_dtrain_command(
      {"ckpt", "export", (tmp.path() / "gpt").string(), "--safetensors", model.string()},
      tmp.path() / "export.log");
  REQUIRE_MESSAGE(e.rc == 0, e.describe());
  // Trained vocabulary: ordinary tokens below vocab - 6, <|endoftext|> at vocab - 6.
  const int64_t candidates = t.data.vocab - 5;
  struct Case {
    const char* name;
    std::vector<std::string> args;
    bool greedy;
  };
  // The prompt's 10 tokens + 24 pass the 16-token context: the window slides for the last
  // ones (the cache, when on, serves the tokens before).
  const Case cases[] = {
      {"sampled", {"--samples", "2", "--tokens", "24", "--ignore-end", "--seed", "7"}, false},
      {"greedy", {"--temperature", "0", "--tokens", "24", "--ignore-end"}, true},
      {"sampled, no cache",
       {"--samples", "2", "--tokens", "24", "--ignore-end", "--seed", "7", "--no-cache"},
       false},
      {"top-k, top-p", {"--top-k", "5", "--top-p", "0.8", "--tokens", "6"}, false},
      // Samples that end at <|endoftext|> while the others go on (the cache keeps
      // running them): 6 samples, 24 tokens each at most.
      {"ending early", {"--samples", "6", "--tokens", "24", "--seed", "3"}, false},
      // A prompt longer than the context: its last 16 tokens, every token a window.
      {"long prompt",
       {"--prompt", "The old king sees the farmer near the house. A horse walked in the garden.",
        "--tokens", "6", "--ignore-end"},
       false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string name = c.name;
    std::vector<std::string> args = {t.job.string()};
    if (name != "long prompt") args.insert(args.end(), {"--prompt", "The old king"});
    args.insert(args.end(), c.args.begin(), c.args.end());
    const nlohmann::json g = generate_json(tmp.path(), "gen.log", args);
    CHECK(g.at("step") == 30);
    const fs::path json = tmp.path() / "gen.json";
    write_bytes(json, g.dump());
    const fs::path log = tmp.path() / "reference.log";
    CHECK_MESSAGE(reference_check(model, json, log, candidates, c.greedy) == 0, read_bytes(log));
    CHECK(g.at("prompt_cut") == (name == "long prompt"));
    if (name == "long prompt") CHECK(g.at("cached_steps") == 0);
    if (name != "top-k, top-p" && name != "ending early" && name != "long prompt") {
      for (const auto& s : g.at("samples")) CHECK(s.at("ids").size() == 24);
    }
    if (name == "ending early") {  // some ended before 24 tokens, on <|endoftext|>
      int ended = 0;
      for (const auto& s : g.at("samples")) {
        if (!s.at("ended").get<bool>()) continue;
        ++ended;
        CHECK(s.at("ids").back() == t.data.vocab - 6);
        CHECK(s.at("ids").size() < 24);
      }
      CHECK(ended > 0);
    }
  }
}

// What a user downloads from the Hugging Face Hub for GPT-2: model.safetensors under
// GPT2Model's names (with the mask buffers and the tied head's copy), vocab.json and
// merges.txt, here a small one that tests/scripts/make_hf_gpt2.py writes. The job says
// the shape; --tokenizer takes the directory.
TEST_CASE("generate: Hugging Face GPT-2 files (model.safetensors, vocab.json, merges.txt)") {
  TempDir tmp("generate-hf");
  const fs::path hf = tmp.path() / "gpt2-hf";
  const std::string make =
      std::string("python3 ") + DTRAIN_SOURCE_DIR + "/tests/scripts/make_hf_gpt2.py " +
      hf.string() + " --layers 2 --hidden 32 --heads " + std::to_string(kHeads) + " --context " +
      std::to_string(kContext) + " > " + (tmp.path() / "make.log").string() + " 2>&1";
  REQUIRE(std::system(make.c_str()) == 0);
  const int64_t vocab = std::stoll(read_bytes(tmp.path() / "make.log"));  // <|endoftext|> last
  const fs::path job = tmp.path() / "hf.yaml";
  // The model's shape and nothing to train: generate checks no training keys.
  std::ofstream(job) << "model: {arch: gpt2-tiny, layers: 2, hidden: 32, heads: " << kHeads
                     << ", seq_len: " << kContext << ",\n        max_positions: " << kContext
                     << ", vocab_size: " << vocab << "}\n"
                     << "data: {dataset: synthetic}\n";
  const fs::path model = hf / "model.safetensors";
  for (const bool greedy : {false, true}) {
    CAPTURE(greedy);
    std::vector<std::string> args = {
        job.string(),       "--checkpoint", model.string(), "--tokenizer",  hf.string(), "--prompt",
        "the thin and the", "--tokens",     "24",           "--ignore-end", "--samples", "2"};
    if (greedy) args.insert(args.end(), {"--temperature", "0"});
    const nlohmann::json g = generate_json(tmp.path(), "gen.log", args);
    // <|endoftext|>, then "the thin and the" in the file's merges: t he Ġt h in Ġa nd Ġthe.
    CHECK(g.at("prompt_ids") ==
          std::vector<int>{static_cast<int>(vocab - 1), 83, 257, 256, 71, 259, 260, 261, 258});
    const fs::path json = tmp.path() / "gen.json";
    write_bytes(json, g.dump());
    const fs::path log = tmp.path() / "reference.log";
    CHECK_MESSAGE(reference_check(model, json, log, vocab, greedy) == 0, read_bytes(log));
  }
  // Weights that overflow at a position the run never reaches (the 16th): the prompt's
  // forward runs at its exact length and the cache covers the rest, so nothing of that
  // row enters. (With --no-cache the padded forwards reach it: their masked attention
  // multiplies its non-finite values by 0.)
  const fs::path poisoned = tmp.path() / "poisoned";
  const std::string poison = std::string("python3 ") + DTRAIN_SOURCE_DIR +
                             "/tests/scripts/make_hf_gpt2.py " + poisoned.string() +
                             " --layers 2 --hidden 32 --heads " + std::to_string(kHeads) +
                             " --context " + std::to_string(kContext) + " --poison-position 15 > " +
                             (tmp.path() / "poison.log").string() + " 2>&1";
  REQUIRE(std::system(poison.c_str()) == 0);
  const nlohmann::json p = generate_json(
      tmp.path(), "poisoned.log",
      {job.string(), "--checkpoint", (poisoned / "model.safetensors").string(), "--tokenizer",
       hf.string(), "--prompt", "the", "--tokens", "8", "--ignore-end"});
  CHECK(p.at("samples")[0].at("ids").size() == 8);
  // The head count no tensor shows comes from config.json's n_head.
  const RunResult r = generate(tmp.path(), "heads.log",
                               {job.string(), "--checkpoint", model.string(), "--tokenizer",
                                hf.string(), "--set", "model.heads=4"});
  CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
  CHECK_MESSAGE(contains(r.log, "the model has 2 attention heads, the job's model.heads is 4"),
                r.log);
}

TEST_CASE(
    "generate: one seed gives one text, a sample does not depend on the samples beside "
    "it, and the weights come from where they are asked") {
  TempDir tmp("generate-invariants");
  const Trained t = train_small(tmp.path());
  const std::vector<std::string> base = {t.job.string(), "--prompt", "A horse",
                                         "--tokens",     "12",       "--ignore-end"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const nlohmann::json one = generate_json(tmp.path(), "one.log", with({}));
  const nlohmann::json again = generate_json(tmp.path(), "again.log", with({}));
  const nlohmann::json three = generate_json(tmp.path(), "three.log", with({"--samples", "3"}));
  const nlohmann::json other = generate_json(tmp.path(), "other.log", with({"--seed", "99"}));
  const nlohmann::json& s = one.at("samples")[0];
  CHECK(again.at("samples")[0] == s);
  // The prompt's forward, then cached steps while the P + t positions fit the context
  // (t = 1 .. 11), then forwards over the sliding window; without the cache 12 forwards,
  // the same tokens and (to rounding) log-probabilities.
  const int64_t prompt = static_cast<int64_t>(one.at("prompt_ids").size());
  const int64_t cached = std::clamp<int64_t>(kContext - prompt, 0, 11);
  CHECK(cached > 0);
  CHECK(one.at("cached_steps") == cached);
  CHECK(one.at("forwards") == 12 - cached);
  const nlohmann::json uncached = generate_json(tmp.path(), "uncached.log", with({"--no-cache"}));
  CHECK(uncached.at("forwards") == 12);
  CHECK(uncached.at("cached_steps") == 0);
  CHECK(uncached.at("samples")[0].at("ids") == s.at("ids"));
  for (size_t k = 0; k < s.at("logprobs").size(); ++k) {
    CHECK(uncached.at("samples")[0].at("logprobs")[k].get<double>() ==
          doctest::Approx(s.at("logprobs")[k].get<double>()).epsilon(1e-5));
  }
  CHECK(three.at("samples")[0].at("ids") == s.at("ids"));
  CHECK(three.at("samples")[0].at("text") == s.at("text"));
  CHECK(three.at("samples")[1].at("ids") != s.at("ids"));
  CHECK(other.at("samples")[0].at("ids") != s.at("ids"));
  CHECK(contains(one.at("weights").get<std::string>(), "step-00000030.dtckpt"));

  // An older checkpoint by path, and an export of the newest: the export carries the
  // same f32 weights, so the same tokens with the same log-probabilities.
  const fs::path older = tmp.path() / "gpt" / "checkpoints" / "step-00000020.dtckpt";
  const nlohmann::json at20 =
      generate_json(tmp.path(), "at20.log", with({"--checkpoint", older.string()}));
  CHECK(at20.at("step") == 20);
  CHECK(at20.at("samples")[0].at("logprobs") != s.at("logprobs"));
  const fs::path model = tmp.path() / "gpt.safetensors";
  REQUIRE(run_dtrain_command(
              {"ckpt", "export", (tmp.path() / "gpt").string(), "--safetensors", model.string()},
              tmp.path() / "export.log")
              .rc == 0);
  const nlohmann::json exported =
      generate_json(tmp.path(), "exported.log", with({"--checkpoint", model.string()}));
  CHECK(exported.at("step") == 30);  // the export records its checkpoint's step
  CHECK(exported.at("samples")[0] == s);
  const fs::path renamed = tmp.path() / "weights.bin";  // known by its bytes, not its name
  fs::copy_file(model, renamed);
  CHECK(generate_json(tmp.path(), "renamed.log", with({"--checkpoint", renamed.string()}))
            .at("samples")[0] == s);

  // A prompt that fills the context with its <|endoftext|> dropped is not cut: every
  // token of the user's text is seen.
  const int64_t fits = static_cast<int64_t>(one.at("prompt_ids").size()) - 1;
  const nlohmann::json full = generate_json(
      tmp.path(), "full.log", with({"--set", "model.seq_len=" + std::to_string(fits)}));
  CHECK(full.at("context") == fits);
  CHECK_FALSE(full.at("prompt_cut").get<bool>());
  CHECK(full.at("cached_steps") == 0);
  // The job laid out for 4 ranks (2 x 2, ZeRO-1, nodes of 8) still generates in one
  // process: the layout's checks do not apply.
  const nlohmann::json grid =
      generate_json(tmp.path(), "grid.log",
                    with({"--set", "parallel.data=2", "--set", "parallel.tensor=2", "--set",
                          "parallel.zero_stage=1", "--set", "comm.ranks_per_node=8"}));
  CHECK(grid.at("samples")[0] == s);

  // The console form: the prompt and its continuation on stdout, the source on stderr.
  const RunResult plain = generate(tmp.path(), "plain.log", base);
  REQUIRE_MESSAGE(plain.rc == 0, plain.describe());
  CHECK(contains(plain.log, "A horse" + s.at("text").get<std::string>()));
  CHECK(contains(plain.log, "step-00000030.dtckpt (step 30)"));
}

// A context shorter than the first graph's 16 positions (the forward never exceeds it),
// with and without the cache.
TEST_CASE("generate: a model whose context is shorter than 16 tokens") {
  TempDir tmp("generate-short");
  const TokenDir data = tokenize(tmp.path(), 100);
  const fs::path job = tmp.path() / "short.yaml";
  std::ofstream(job) << "run: {output_dir: " << (tmp.path() / "run").string() << ", seed: 1}\n"
                     << "model: {arch: gpt2-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 8,\n"
                     << "        max_positions: 8, vocab_size: " << data.vocab << "}\n"
                     << "data: {dataset: tokens, path: " << data.dir.string()
                     << ", global_batch: 4}\n"
                     << "optimizer: {name: adamw, lr: 0.01}\n"
                     << "train: {steps: 4, checkpoint: {every: 4}}\n"
                     << "logging: {console: false}\n";
  const RunResult r = run_dtrain({job.string()}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json g = generate_json(
      tmp.path(), "gen.log", {job.string(), "--prompt", "The", "--tokens", "12", "--ignore-end"});
  CHECK(g.at("context") == 8);
  CHECK(g.at("samples")[0].at("ids").size() == 12);
  CHECK(g.at("cached_steps").get<int>() > 0);
  const nlohmann::json n = generate_json(
      tmp.path(), "gen-no-cache.log",
      {job.string(), "--prompt", "The", "--tokens", "12", "--ignore-end", "--no-cache"});
  CHECK(n.at("samples")[0].at("ids") == g.at("samples")[0].at("ids"));
}

// A model of synthetic tokens with a tokenizer given by hand: its draws include single
// bytes that are not UTF-8 on their own, which --json must still print (as U+FFFD in
// "text"; "ids" keep every byte).
TEST_CASE("generate: synthetic-token weights with --tokenizer, and bytes that are not UTF-8") {
  TempDir tmp("generate-synthetic");
  const TokenDir tok = tokenize(tmp.path(), 100);
  const fs::path job = tmp.path() / "synthetic.yaml";
  std::ofstream(job) << "run: {output_dir: " << (tmp.path() / "run").string() << ", seed: 3}\n"
                     << "model: {arch: gpt2-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 16,\n"
                     << "        max_positions: 16, vocab_size: 320}\n"
                     << "data: {dataset: synthetic, global_batch: 4}\n"
                     << "optimizer: {name: adamw, lr: 0.001}\n"
                     << "train: {steps: 2, checkpoint: {every: 2}}\n"
                     << "logging: {console: false}\n";
  const RunResult r = run_dtrain({job.string()}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json g =
      generate_json(tmp.path(), "gen.log",
                    {job.string(), "--tokenizer", (tok.dir / "tokenizer.json").string(), "--tokens",
                     "40", "--ignore-end", "--seed", "1"});
  const nlohmann::json& s = g.at("samples")[0];
  REQUIRE(s.at("ids").size() == 40);
  bool high_byte = false;  // a lone byte >= 0x80: invalid UTF-8 by itself
  for (const auto& id : s.at("ids")) {
    const int v = id.get<int>();
    high_byte = high_byte || (v >= 0x80 && v < 0x100);
    CHECK(v < tok.vocab - 5);  // the tokenizer's tokens and <|endoftext|>, never [PAD] or 300+
  }
  CHECK(high_byte);
  CHECK(contains(s.at("text").get<std::string>(), "\xEF\xBF\xBD"));  // U+FFFD
}

// Resume allows another head count (no tensor changes shape); the checkpoints after it
// record the resumed job's, not the one read.
// The head count is the one part of the model no tensor's shape shows: the checkpoints
// record it, and a resume (as generate) with another count is refused.
TEST_CASE("train --resume with another head count is refused, as generate refuses it") {
  TempDir tmp("generate-resumed-heads");
  const Trained t = train_small(tmp.path(), 10);
  const RunResult r = run_dtrain(
      {t.job.string(), "--resume", "latest", "--set", "model.heads=4", "--set", "train.steps=20"},
      tmp.path() / "resume.log");
  CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
  CHECK_MESSAGE(
      contains(r.log, "the model was trained with 2 attention heads, the job's model.heads is 4"),
      r.log);
  const RunResult g =
      generate(tmp.path(), "gen.log", {t.job.string(), "--set", "model.heads=4", "--tokens", "3"});
  CHECK_MESSAGE(g.rc == kExitBadInput, g.describe());
  CHECK_MESSAGE(contains(g.log, "the model has 2 attention heads, the job's model.heads is 4"),
                g.log);
}

TEST_CASE("generate refuses what it cannot use with exit 2, naming it") {
  TempDir tmp("generate-refusals");
  const Trained t = train_small(tmp.path(), 10);
  const std::string job = t.job.string();
  struct Case {
    const char* name;
    std::vector<std::string> args;
    const char* says;
  };
  const fs::path nothing = tmp.path() / "nothing";
  fs::create_directories(nothing);
  const fs::path model = tmp.path() / "gpt.safetensors";
  REQUIRE(run_dtrain_command(
              {"ckpt", "export", (tmp.path() / "gpt").string(), "--safetensors", model.string()},
              tmp.path() / "export.log")
              .rc == 0);
  const Case cases[] = {
      {"a BERT", {job, "--set", "model.arch=bert-tiny"}, "continues text with a GPT-2"},
      {"no checkpoint yet",
       {job, "--set", "run.output_dir=" + (tmp.path() / "fresh").string()},
       "no checkpoint in"},
      {"an empty checkpoint directory", {job, "--checkpoint", nothing.string()}, "no checkpoint"},
      {"another model's checkpoint",
       {job, "--set", "model.hidden=64"},
       "is [300, 32] in the checkpoint, [300, 64] in the job's model"},
      // The head count is the one shape no tensor shows: the checkpoint and the export
      // record it.
      {"another head count",
       {job, "--set", "model.heads=4"},
       "the model has 2 attention heads, the job's model.heads is 4"},
      {"another head count, from the export",
       {job, "--set", "model.heads=4", "--checkpoint", model.string()},
       "the model has 2 attention heads, the job's model.heads is 4"},
      {"a negative temperature", {job, "--temperature", "-1"}, "--temperature -1"},
      {"a seed past 2^63 - 1",
       {job, "--seed", "9223372036854775808"},
       "--seed 9223372036854775808: expected a whole number"},
      {"a prompt file that is a directory", {job, "--prompt-file", nothing.string()}, "not a file"},
      {"top-p 0", {job, "--top-p", "0"}, "--top-p 0"},
      {"top-p above 1", {job, "--top-p", "1.5"}, "--top-p 1.5"},
      {"a prompt twice",
       {job, "--prompt", "a", "--prompt-file", job},
       "--prompt and --prompt-file"},
      {"a missing prompt file", {job, "--prompt-file", "/nonexistent"}, "/nonexistent"},
      {"synthetic data without a tokenizer",
       {job, "--set", "data.dataset=synthetic"},
       "pass --tokenizer"},
      {"a missing tokenizer", {job, "--tokenizer", "/nonexistent.json"}, "/nonexistent.json"},
      {"a tokenizer larger than the vocabulary",
       {job, "--set", "model.vocab_size=200"},
       "more than the model's vocabulary (200)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const RunResult r = generate(tmp.path(), "refused.log", c.args);
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    CHECK_MESSAGE(contains(r.log, c.says), r.log);
  }
}

// logging.samples: text from the GPT-2 as it trains, every 10 steps, drawn as `dtrain
// generate --seed <run.seed + step>` draws from that step's checkpoint; a resumed run
// writes each step's samples once (a later line left by the stopped run is dropped); and
// what the job cannot sample is refused before any step.
TEST_CASE("logging.samples: text as the model trains, as generate draws it, once on resume") {
  TempDir tmp("train-samples");
  const TokenDir data = tokenize(tmp.path(), 300);
  const fs::path job = gpt_job(tmp.path(), "gpt", data, 20);
  const std::string samples = "logging.samples={every: 10, prompt: 'The old', tokens: 6, count: 2}";
  const fs::path whole = tmp.path() / "whole", part = tmp.path() / "part";
  const RunResult r =
      run_dtrain({job.string(), "--set", samples, "--set", "run.output_dir=" + whole.string()},
                 tmp.path() / "whole.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  std::vector<nlohmann::json> lines;
  {
    std::ifstream in(whole / "samples.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  }
  REQUIRE(lines.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(lines[i].at("step") == (i < 2 ? 10 : 20));
    CHECK(lines[i].at("sample") == i % 2);
    CHECK(lines[i].at("seed") == 1 + lines[i].at("step").get<int>());
    CHECK(lines[i].at("prompt") == "The old");
    CHECK(lines[i].at("ids").size() <= 6);
  }
  CHECK(lines[0].at("text") != lines[1].at("text"));  // two draws, two texts
  const nlohmann::json g = generate_json(
      tmp.path(), "g.log",
      {job.string(), "--checkpoint", (whole / "checkpoints" / "step-00000010.dtckpt").string(),
       "--prompt", "The old", "--tokens", "6", "--samples", "2", "--seed", "11", "--temperature",
       "0.8", "--no-cache"});
  for (size_t b = 0; b < 2; ++b) {
    CAPTURE(b);
    CHECK(g.at("samples")[b].at("text") == lines[b].at("text"));
    CHECK(g.at("samples")[b].at("ended") == lines[b].at("ended"));
  }

  CHECK(lines[0].at("weights") == "model");
  // With optimizer.ema the samples are of the average, which generate reads by default
  // (--weights auto): the same texts again.
  const fs::path avg = tmp.path() / "ema";
  const RunResult e =
      run_dtrain({job.string(), "--set", samples, "--set", "optimizer.ema.decay=0.9", "--set",
                  "run.output_dir=" + avg.string()},
                 tmp.path() / "ema.log");
  REQUIRE_MESSAGE(e.rc == 0, e.describe());
  CHECK(contains(e.log, "sample 0 at step 10 (EMA weights)"));
  std::vector<nlohmann::json> averaged;
  {
    std::ifstream in(avg / "samples.jsonl");
    for (std::string line; std::getline(in, line);) averaged.push_back(nlohmann::json::parse(line));
  }
  REQUIRE(averaged.size() == 4);
  const nlohmann::json ge = generate_json(
      tmp.path(), "ge.log",
      {job.string(), "--checkpoint", (avg / "checkpoints" / "step-00000010.dtckpt").string(),
       "--prompt", "The old", "--tokens", "6", "--samples", "2", "--seed", "11", "--temperature",
       "0.8", "--no-cache"});
  CHECK(ge.at("ema") == true);
  for (size_t b = 0; b < 2; ++b) {
    CAPTURE(b);
    CHECK(averaged[b].at("weights") == "ema");
    CHECK(ge.at("samples")[b].at("text") == averaged[b].at("text"));
  }

  // The run copied and cut back to step 10, with a line its crash left after the step:
  // resumed, it writes the file the whole run wrote.
  fs::create_directories(part);
  fs::copy(whole, part, fs::copy_options::recursive);
  fs::remove(part / "checkpoints" / "step-00000020.dtckpt");
  std::ofstream(part / "samples.jsonl", std::ios::app)
      << "{\"step\": 15, \"sample\": 0, \"text\": \"left by a crash\"}\n";
  const RunResult resumed = run_dtrain({job.string(), "--set", samples, "--set",
                                        "run.output_dir=" + part.string(), "--resume", "latest"},
                                       tmp.path() / "part.log");
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.describe());
  CHECK(read_bytes(part / "samples.jsonl") == read_bytes(whole / "samples.jsonl"));

  // Sampling changes no training bit: the run without samples logs the same losses. A
  // fresh run into the directory (the checkpoints cleared) starts samples.jsonl anew.
  const fs::path plain = tmp.path() / "plain";
  const RunResult p =
      run_dtrain({job.string(), "--set", "run.output_dir=" + plain.string()}, tmp.path() / "p.log");
  REQUIRE_MESSAGE(p.rc == 0, p.describe());
  const auto a = read_losses(whole / "metrics.jsonl"), b = read_losses(plain / "metrics.jsonl");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].loss == b[i].loss);
  fs::remove_all(part / "checkpoints");
  fs::remove(part / "metrics.jsonl");
  fs::remove(part / "summary.json");
  const RunResult again =
      run_dtrain({job.string(), "--set", samples, "--set", "run.output_dir=" + part.string()},
                 tmp.path() / "again.log");
  REQUIRE_MESSAGE(again.rc == 0, again.describe());
  CHECK(read_bytes(part / "samples.jsonl") == read_bytes(whole / "samples.jsonl"));

  struct Case {
    std::vector<std::string> sets;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"data.dataset=synthetic", "data.path=null"}, "logging.samples.every"},
      {{"logging.samples={every: 5, count: 9}"}, "logging.samples.count"},
      {{"logging.samples={every: 5, tokens: 16}"}, "logging.samples.tokens"},
      {{"logging.samples={every: 5, tokens: 8, prompt: 'the old king sees the farmer near "
        "the house and the river'}"},
       "pass the context of 16"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.says);
    std::vector<std::string> args = {job.string(), "--set", samples, "--set",
                                     "run.output_dir=" + (tmp.path() / "bad").string()};
    for (const std::string& s : c.sets) args.insert(args.end(), {"--set", s});
    const RunResult bad = run_dtrain(args, tmp.path() / "bad.log");
    CHECK_MESSAGE(bad.rc == kExitBadInput, bad.describe());
    CHECK_MESSAGE(contains(bad.log, c.says), bad.log);
    // dtrain validate refuses the same job with the same words (it opens the tokenizer).
    args.insert(args.begin(), "validate");
    const RunResult checked = run_dtrain_command(args, tmp.path() / "validate.log");
    CHECK_MESSAGE(checked.rc == kExitBadInput, checked.describe());
    CHECK_MESSAGE(contains(checked.log, c.says), checked.log);
  }
}
