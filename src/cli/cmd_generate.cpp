// `dtrain generate JOB.yaml [--checkpoint PATH] [--prompt TEXT | --prompt-file F]
// [--tokens N] [--samples K] [--temperature T] [--top-k K] [--top-p P] [--seed S]
// [--tokenizer F] [--ignore-end] [--no-cache] [--device D] [--json] [--set key=value ...]`:
// text from a trained GPT-2 (runtime/generate.h). The job file names the model and its tokenizer;
// its parallel layout does not matter (one process reads any layout's checkpoint).
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "runtime/generate.h"

namespace dtrain::cli {
namespace {

struct GenerateArgs {
  std::string job;
  std::vector<std::string> overrides;
  std::string checkpoint, tokenizer, prompt, prompt_file, device;
  std::string which_weights = "auto";
  int64_t tokens = 64;
  int samples = 1;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  std::string seed;  // empty: the job's run.seed
  bool ignore_end = false;
  bool no_cache = false;
  bool json = false;
};

constexpr size_t kMaxPromptBytes = size_t{1} << 24;

// The prompt as the file holds it (a final newline included); "-" reads standard input.
std::string read_prompt_file(const std::string& file) {
  std::ostringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
  } else {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
      throw Error(fmt::format("--prompt-file {}: not a file", file),
                  "pass a text file, or - for "
                  "standard input");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(fmt::format("--prompt-file {}: cannot open it", file));
    text << in.rdbuf();
  }
  std::string s = text.str();
  if (s.size() > kMaxPromptBytes) {
    throw Error(fmt::format("--prompt-file {}: {} bytes, more than the {} a prompt may have", file,
                            s.size(), kMaxPromptBytes),
                "the model sees its last model.seq_len tokens only; pass the end of the text");
  }
  return s;
}

// --seed as run.seed takes it: a whole number in [0, 2^63 - 1], nothing clamped.
uint64_t parse_seed(const std::string& text) {
  int64_t v = -1;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 0) {
    throw Error(fmt::format("--seed {}: expected a whole number from 0 to {}", text, INT64_MAX));
  }
  return static_cast<uint64_t>(v);
}

void check_sampling(const GenerateArgs& a) {
  if (!std::isfinite(a.temperature) || a.temperature < 0.0) {
    throw Error(fmt::format("--temperature {}: must be 0 (greedy) or more", a.temperature),
                "1 samples from the model as it is; lower is more conservative");
  }
  if (!(a.top_p > 0.0 && a.top_p <= 1.0)) {
    throw Error(fmt::format("--top-p {}: must be in (0, 1]", a.top_p),
                "1 keeps every token; 0.9 keeps the most likely tokens holding 90% of the "
                "probability");
  }
  if (!a.prompt.empty() && !a.prompt_file.empty())
    throw Error("--prompt and --prompt-file: give one of them");
}

nlohmann::json to_json(const runtime::GenerateResult& g) {
  nlohmann::json samples = nlohmann::json::array();
  for (const runtime::GeneratedSample& s : g.samples) {
    samples.push_back(
        {{"text", s.text}, {"ids", s.ids}, {"logprobs", s.logprobs}, {"ended", s.ended}});
  }
  return {{"weights", g.weights},
          {"ema", g.ema},
          {"step", g.step >= 0 ? nlohmann::json(g.step) : nullptr},
          {"prompt_ids", g.prompt_ids},
          {"context", g.context},
          {"prompt_cut", g.prompt_cut},
          {"forwards", g.forwards},
          {"cached_steps", g.cached_steps},
          {"seconds", g.seconds},
          {"samples", samples}};
}

int run_generate_job(const GenerateArgs& a, Job job);

int run_generate(const GenerateArgs& a) {
  check_sampling(a);
  return run_model_job(a.job, a.overrides, a.device,
                       [&](Job job) { return run_generate_job(a, std::move(job)); });
}

int run_generate_job(const GenerateArgs& a, Job job) {
  runtime::GenerateRequest r;
  r.job = std::move(job);
  r.weights = a.checkpoint;
  r.which_weights = a.which_weights;
  r.tokenizer = a.tokenizer;
  r.prompt = a.prompt_file.empty() ? a.prompt : read_prompt_file(a.prompt_file);
  r.tokens = a.tokens;
  r.samples = a.samples;
  r.sampling = {a.temperature, a.top_k, a.top_p};
  r.seed = a.seed.empty() ? static_cast<uint64_t>(r.job.run.seed) : parse_seed(a.seed);
  r.stop_at_end = !a.ignore_end;
  r.cache = !a.no_cache;
  if (!a.json) {
    r.on_start = [](const runtime::GenerateResult& g) {  // before the first forward
      const std::string step = weights_label(g.step, g.ema);
      std::fprintf(stderr,
                   "dtrain: generating from %s%s: <|endoftext|> and %zu prompt tokens, context "
                   "%lld\n",
                   g.weights.c_str(), step.c_str(), g.prompt_ids.size() - 1,
                   static_cast<long long>(g.context));
      if (g.prompt_cut) {
        std::fprintf(stderr,
                     "dtrain: warning: the prompt is longer than the model's context "
                     "(model.seq_len %lld tokens): only its end is seen\n",
                     static_cast<long long>(g.context));
      }
    };
  }
  const runtime::GenerateResult g = runtime::generate(r);
  if (a.json) {
    // Byte-level tokens can end inside a UTF-8 character: "text" shows such bytes as
    // U+FFFD, and "ids" keeps them exactly.
    std::printf("%s\n",
                to_json(g).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return kExitOk;
  }
  int64_t made = 0;
  for (size_t i = 0; i < g.samples.size(); ++i) {
    const runtime::GeneratedSample& s = g.samples[i];
    made += static_cast<int64_t>(s.ids.size());
    if (g.samples.size() > 1) std::printf("--- sample %zu ---\n", i + 1);
    std::printf("%s%s\n", r.prompt.c_str(), s.text.c_str());
  }
  std::fprintf(stderr,
               "dtrain: %lld tokens drawn in %.2f s (%.1f tokens/s; %lld forwards over the "
               "context, %lld cached steps)\n",
               static_cast<long long>(made), g.seconds,
               g.seconds > 0 ? static_cast<double>(made) / g.seconds : 0.0,
               static_cast<long long>(g.forwards), static_cast<long long>(g.cached_steps));
  return kExitOk;
}

}  // namespace

Job load_model_job(const std::string& file, std::vector<std::string> overrides,
                   const std::string& device, config::SourceMap* where) {
  std::vector<std::string> warnings;
  config::ValidateContext ctx;
  ctx.model_only = true;
  ctx.warnings = &warnings;
  add_device_override(device, overrides);
  Job job = config::load_job_file(file, overrides, ctx, where);
  for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
  return job;
}

int run_model_job(const std::string& file, const std::vector<std::string>& overrides,
                  const std::string& device, const std::function<int(Job)>& run) {
  config::SourceMap where;
  Job job = load_model_job(file, overrides, device, &where);
  int rc = kExitOk;
  config::located_errors(where, [&] { rc = run(std::move(job)); });
  return rc;
}

void add_generate(CLI::App& app, Action& action) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "continue a prompt with a trained GPT-2 (the job's newest checkpoint)");
  cmd->add_option("job", args->job, "job file (YAML) of the model")->required();
  cmd->add_option("--set", args->overrides, "override a key, e.g. --set model.seq_len=256")
      ->allow_extra_args(false);
  cmd->add_option("--checkpoint", args->checkpoint,
                  "weights: a checkpoint (file or sharded directory), a run or checkpoint "
                  "directory (its newest), best (train.best's), or a .safetensors file (dtrain "
                  "ckpt export, Hugging Face GPT-2); default: the job's newest checkpoint, else "
                  "model.init_from");
  add_weights_option(cmd, args->which_weights);
  cmd->add_option("--prompt", args->prompt, "text to continue (default: none, a new document)");
  cmd->add_option("--prompt-file", args->prompt_file,
                  "read the prompt from a file (- for standard input), a final newline kept");
  cmd->add_option("--tokens", args->tokens, "new tokens per sample at most (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--samples", args->samples, "samples, run as one batch (default 1)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--temperature", args->temperature,
                  "divides the logits; 0 takes the most likely token (default 1)");
  cmd->add_option("--top-k", args->top_k, "draw among the k most likely tokens; 0: all (default)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--top-p", args->top_p,
                  "then among the most likely tokens holding this probability (default 1)");
  cmd->add_option("--seed", args->seed, "sampling seed, 0 to 2^63 - 1 (default: run.seed)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "tokenizer.json, or a directory with it or with GPT-2's vocab.json and "
                  "merges.txt (default: data.path's, the training text's)");
  cmd->add_flag("--ignore-end", args->ignore_end,
                "go on past <|endoftext|> (default: a sample ends there)");
  cmd->add_flag("--no-cache", args->no_cache,
                "no key/value cache: run the whole context for every token (slower; the "
                "cache's check)");
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N instead of the job's device");
  cmd->add_flag("--json", args->json,
                "print JSON: each sample's text, token ids and their log-probabilities");
  cmd->callback([args, &action] { action = [args] { return run_generate(*args); }; });
}

}  // namespace dtrain::cli
