// `dtrain data tokenize --input PATH... --out DIR (--vocab-size N | --vocab-json F
// --merges-txt F | --tokenizer F) [--labelled] [--val-fraction F] [--seed S]`: reads a
// text corpus, trains a byte-level BPE tokenizer on its training documents (or loads
// GPT-2's, or an earlier run's tokenizer.json: fine-tuning data for a pretrained model),
// and writes DIR/tokenizer.json, DIR/train.bin and DIR/val.bin (the data.path of a
// `dataset: tokens` job). --labelled: each input is a class, or one .jsonl / .tsv / .csv input
// holds labelled rows (DIR/labels.json and one label per text in
// DIR/{train,val}.labels.bin), for a BERT classifier. The rules for
// inputs and documents are in data/text_corpus.h.
// `dtrain data bench JOB [--workers 0,2,4] [--batches N] [--split train|test] [--json]
// [--out F]`: times the job's data pipeline alone (rank 0's share), per worker count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "config/config.h"
#include "core/error.h"
#include "data/atomic_file.h"
#include "data/text_corpus.h"
#include "data/text_loader.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "runtime/data_feed.h"

namespace dtrain::cli {
namespace {

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out;
  int64_t vocab_size = 0;
  double val_fraction = 0.01;
  std::string vocab_json;
  std::string merges_txt;
  std::string tokenizer;  // an earlier run's tokenizer.json
  bool labelled = false;
  uint64_t seed = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Tokenizer make_tokenizer(const TokenizeArgs& args, const TextCorpus& corpus,
                         const std::vector<DocSplit>& split) {
  if (!args.vocab_json.empty()) return Tokenizer::load_gpt2(args.vocab_json, args.merges_txt);
  if (!args.tokenizer.empty()) return Tokenizer::load(args.tokenizer);
  std::vector<std::string_view> docs;
  for (size_t i = 0; i < split.size(); ++i)
    if (split[i] == DocSplit::train) docs.push_back(corpus.document(i));
  return Tokenizer::train(docs, args.vocab_size);
}

void check_args(const TokenizeArgs& args) {
  if (!args.tokenizer.empty() &&
      (args.vocab_size != 0 || !args.vocab_json.empty() || !args.merges_txt.empty()))
    throw Error(
        "--tokenizer reuses a tokenizer; it cannot be combined with --vocab-size, "
        "--vocab-json or --merges-txt",
        "pass one way to get a vocabulary");
  if (!args.tokenizer.empty()) return;
  const bool gpt2 = !args.vocab_json.empty() || !args.merges_txt.empty();
  if (gpt2 && (args.vocab_json.empty() || args.merges_txt.empty()))
    throw Error("--vocab-json and --merges-txt go together",
                "pass both of GPT-2's files, or neither and --vocab-size N to train a tokenizer");
  if (gpt2 && args.vocab_size != 0)
    throw Error("--vocab-size trains a new tokenizer; it cannot be combined with --vocab-json",
                "drop --vocab-size to use GPT-2's vocabulary as it is");
  if (!gpt2 && args.vocab_size == 0)
    throw Error(
        "dtrain data tokenize needs --vocab-size N (or GPT-2's --vocab-json and "
        "--merges-txt, or --tokenizer DIR/tokenizer.json of an earlier run)",
        "e.g. --vocab-size 8192");
  if (!gpt2 && args.vocab_size < kMinVocab)
    throw Error(fmt::format("--vocab-size {} is below {} (256 byte tokens and {} specials)",
                            args.vocab_size, kMinVocab, kNumSpecials),
                "typical sizes are 4096 to 65536");
  std::error_code ec;
  if (std::filesystem::exists(args.out, ec) && !std::filesystem::is_directory(args.out, ec))
    throw Error(fmt::format("--out {}: exists and is not a directory", args.out),
                "pass a directory (it is created when missing)");
}

int run_tokenize(const TokenizeArgs& args) {
  const auto t0 = std::chrono::steady_clock::now();
  check_args(args);
  LabelledCorpus labelled;
  if (args.labelled) {
    labelled = read_labelled_corpus(args.inputs);
    interleave_classes(labelled, args.seed);
  } else {
    labelled.corpus = read_text_corpus(args.inputs);
  }
  const TextCorpus& corpus = labelled.corpus;
  const std::vector<DocSplit> split =
      split_documents(corpus.documents(), args.seed, args.val_fraction);
  const auto t_tok = std::chrono::steady_clock::now();
  const Tokenizer tok = make_tokenizer(args, corpus, split);
  const double tok_s = seconds_since(t_tok);
  const std::vector<TokenId> train = encode_documents(tok, corpus, split, DocSplit::train);
  const std::vector<TokenId> val = encode_documents(tok, corpus, split, DocSplit::validation);
  const std::filesystem::path dir(args.out);
  tok.save((dir / "tokenizer.json").string());
  write_token_shard((dir / "train.bin").string(), train, tok.vocab_size());
  write_token_shard((dir / "val.bin").string(), val, tok.vocab_size());
  if (args.labelled) {  // one class per text, in the shards' order
    std::vector<TokenId> labels[2];
    for (size_t i = 0; i < split.size(); ++i)
      labels[split[i] == DocSplit::train ? 0 : 1].push_back(labelled.labels[i]);
    const auto classes = static_cast<int64_t>(labelled.names.size());
    write_token_shard((dir / "train.labels.bin").string(), labels[0], classes);
    write_token_shard((dir / "val.labels.bin").string(), labels[1], classes);
    write_class_names(dir.string(), labelled.names);
  } else {  // labels of an earlier --labelled run into this directory would not match
    for (const char* stale : {"labels.json", "train.labels.bin", "val.labels.bin"}) {
      std::error_code ec;
      std::filesystem::remove(dir / stale, ec);
      if (ec) {
        throw Error(fmt::format("{}: cannot remove it: {}", (dir / stale).string(), ec.message()),
                    "it belongs to an earlier --labelled run into this directory; remove it, "
                    "or write into another --out");
      }
    }
  }

  const int64_t val_docs = std::count(split.begin(), split.end(), DocSplit::validation);
  const auto tokens = static_cast<double>(train.size() + val.size());
  std::printf("input: %zu files (%zu skipped), %lld documents (%lld train, %lld val), %lld bytes\n",
              corpus.files.size(), corpus.skipped.size(),
              static_cast<long long>(corpus.documents()),
              static_cast<long long>(corpus.documents() - val_docs),
              static_cast<long long>(val_docs), static_cast<long long>(corpus.bytes()));
  const std::string short_of =
      args.vocab_size > tok.vocab_size()
          ? fmt::format(" (of {} asked: no pair occurs twice any more)", args.vocab_size)
          : "";
  if (args.labelled) {
    std::string per_class;
    for (size_t c = 0; c < labelled.names.size(); ++c) {
      per_class += fmt::format(
          "{}{} {}", c ? ", " : "", labelled.names[c],
          std::count(labelled.labels.begin(), labelled.labels.end(), static_cast<int32_t>(c)));
    }
    std::printf("classes: %zu (%s texts)\n", labelled.names.size(), per_class.c_str());
  }
  std::printf("tokenizer: %s, vocab %lld%s (%zu merges), %.2f s\n",
              !args.tokenizer.empty()   ? "reused"
              : args.vocab_json.empty() ? "trained"
                                        : "GPT-2 files",
              static_cast<long long>(tok.vocab_size()), short_of.c_str(), tok.spec().merges.size(),
              tok_s);
  std::printf("tokens: %zu train, %zu val (%s); %.2f bytes/token\n", train.size(), val.size(),
              tok.vocab_size() <= 65536 ? "u16" : "u32",
              tokens > 0 ? static_cast<double>(corpus.bytes()) / tokens : 0.0);
  std::printf("wrote %s/{tokenizer.json,train.bin,val.bin%s} in %.2f s\n", args.out.c_str(),
              args.labelled ? ",labels.json,train.labels.bin,val.labels.bin" : "",
              seconds_since(t0));
  if (val.empty()) {  // every run ends with an evaluation: dtrain train refuses this directory
    std::fprintf(stderr,
                 "dtrain: warning: val.bin holds no tokens (no document fell to the validation "
                 "split); dtrain train needs at least one window there: %s\n",
                 corpus.documents() < 2
                     ? "the input is one document; split it into several (files, or fortune "
                       "records between lines holding %)"
                     : "give more documents or a larger --val-fraction");
  }
  return kExitOk;
}

// ---- bench ------------------------------------------------------------------

struct BenchArgs {
  std::string job;
  std::vector<std::string> overrides;
  std::vector<int> workers;  // empty: the job's data.workers
  int world = 0;             // 0: from the launcher's environment
  int64_t batches = 20;
  std::string split = "train";
  std::string out;
  bool json = false;
};

// Loads `batches` batches of the job's data (rank 0's share, as `dtrain train` feeds it)
// with each worker count and prints samples per second: whether the input pipeline keeps
// up with the model, without running the model.
int bench_data_job(const BenchArgs& args, Job& job);

// Refusals of the job's keys (data.path's folder, say) name the file and line that wrote
// them.
int run_data_bench(const BenchArgs& args) {
  config::ValidateContext ctx;
  ctx.world_size = args.world > 0 ? args.world : world_from_env();
  std::vector<std::string> warnings;
  ctx.warnings = &warnings;
  config::SourceMap where;
  // The sources keep a reference to the job and read data.workers as each feed opens.
  Job job = config::load_job_file(args.job, args.overrides, ctx, &where);
  for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
  int rc = kExitOk;
  config::located_errors(where, [&] { rc = bench_data_job(args, job); });
  return rc;
}

int bench_data_job(const BenchArgs& args, Job& job) {
  // The bench finds a damaged image (exit 2 naming it), whatever training would do with it.
  job.data.unreadable = UnreadableAction::stop;
  std::vector<int> workers = args.workers;
  if (workers.empty()) workers.push_back(job.data.workers);
  if (workers.size() > 1 && job.data.dataset == DatasetName::tokens) {
    std::fprintf(stderr,
                 "dtrain: note: token data is read in the training thread: data.workers does "
                 "not change its rate\n");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto source =
      runtime::DataSource::open(job, static_cast<uint64_t>(job.run.seed), {0, job.parallel.data});
  const double open_s = seconds_since(t0);
  const runtime::FeedSplit split =
      args.split == "test" ? runtime::FeedSplit::eval : runtime::FeedSplit::train;
  nlohmann::json out = {{"job", args.job},
                        {"dataset", std::string(to_string(job.data.dataset))},
                        {"data", source->describe()},
                        {"split", args.split},
                        {"batch", job.data.micro_batch},
                        {"batches", args.batches},
                        {"open_seconds", open_s},
                        {"results", nlohmann::json::array()}};
  if (!args.json) {
    std::printf(
        "data: %s (opened in %.2f s)\n%s split, %lld batches of %lld per worker count, "
        "from opening the feed to the last batch:\n",
        source->describe().c_str(), open_s, args.split.c_str(),
        static_cast<long long>(args.batches), static_cast<long long>(job.data.micro_batch));
    std::printf("  workers   samples/s   ms/batch   waited\n");
  }
  for (const int w : workers) {
    job.data.workers = w;
    const auto start = std::chrono::steady_clock::now();
    const auto feed = source->feed(split, {}, runtime::FeedContent::all);
    int64_t samples = 0;
    for (int64_t k = 0; k < args.batches; ++k) samples += feed->next().input.shape()[0];
    const double s = seconds_since(start);
    const double rate = static_cast<double>(samples) / s;
    out["results"].push_back({{"workers", w},
                              {"seconds", s},
                              {"samples", samples},
                              {"samples_per_s", rate},
                              {"ms_per_batch", 1e3 * s / static_cast<double>(args.batches)},
                              {"wait_seconds", feed->wait_seconds()}});
    if (!args.json) {
      std::printf("  %7d %11.1f %10.2f %7.0f%%\n", w, rate,
                  1e3 * s / static_cast<double>(args.batches), 100.0 * feed->wait_seconds() / s);
    }
  }
  const std::string text = out.dump(2) + "\n";
  if (args.json) std::fputs(text.c_str(), stdout);
  if (!args.out.empty()) write_file_atomic(args.out, {text});
  return kExitOk;
}

}  // namespace

void add_data(CLI::App& app, Action& action) {
  CLI::App* data =
      app.add_subcommand("data", "prepare training data (tokenize text) and time its loading");
  data->require_subcommand(1);
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = data->add_subcommand(
      "tokenize", "train a byte-level BPE tokenizer and write token shards for language models");
  cmd->add_option("--input", args->inputs, "text files or directories (repeatable)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--out", args->out, "output directory (tokenizer.json, train.bin, val.bin)")
      ->required();
  cmd->add_option("--vocab-size", args->vocab_size,
                  fmt::format("tokens in the trained vocabulary (>= {})", kMinVocab))
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--val-fraction", args->val_fraction,
                  "share of documents held out for validation (default 0.01)")
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--vocab-json", args->vocab_json, "GPT-2 vocab.json (instead of training)");
  cmd->add_option("--merges-txt", args->merges_txt, "GPT-2 merges.txt (with --vocab-json)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "an earlier run's tokenizer.json to encode with (instead of training)");
  cmd->add_flag("--labelled", args->labelled,
                "text classification: each --input is one class, named by its file name; or "
                "one --input FILE.jsonl ({\"text\", \"label\"} per line), FILE.tsv (label, "
                "tab, text per line) or FILE.csv (a header naming \"text\" and \"label\") holds "
                "labelled rows");
  cmd->add_option("--seed", args->seed, "seed of the train/validation split (default 0)");
  cmd->callback([args, &action] { action = [args] { return run_tokenize(*args); }; });

  auto bench = std::make_shared<BenchArgs>();
  CLI::App* b = data->add_subcommand(
      "bench", "time the job's data pipeline alone: samples per second per loader worker count");
  b->add_option("job", bench->job, "job file (YAML)")->required();
  b->add_option("--set", bench->overrides, "override a key, e.g. --set data.micro_batch=64");
  b->add_option("--workers", bench->workers,
                "loader threads to time, a comma list (default: the job's data.workers)")
      ->delimiter(',')
      ->check(CLI::Range(0, 256));
  b->add_option("--world", bench->world,
                "the world size the job will run at (its per-rank batch; default: the "
                "launcher's, else 1)")
      ->check(CLI::Range(1, 1 << 20));
  b->add_option("--batches", bench->batches, "batches per worker count (default 20)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  b->add_option("--split", bench->split, "train (augmented, as training reads it) or test")
      ->check(CLI::IsMember({"train", "test"}));
  b->add_option("--out", bench->out, "also write the JSON here (atomically)");
  b->add_flag("--json", bench->json, "print JSON instead of the table");
  b->callback([bench, &action] { action = [bench] { return run_data_bench(*bench); }; });
}

}  // namespace dtrain::cli
