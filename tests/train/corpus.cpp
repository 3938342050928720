// The generated corpus of the language-model tests and its tokenization by the
// real `dtrain data tokenize`.
#include "corpus.h"

#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace dtrain::train_test {

namespace {

// splitmix64: the corpus is the same on every machine.
class Words {
 public:
  explicit Words(uint64_t seed) : state_(seed) {}
  template <size_t N>
  const char* pick(const char* const (&list)[N]) {
    return list[next() % N];
  }
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

const char* const kAdjectives[] = {"quick", "lazy",  "small", "old",    "bright", "quiet",
                                   "happy", "brave", "tired", "clever", "green",  "little"};
const char* const kNouns[] = {"fox",   "dog",     "cat",  "farmer", "teacher", "river",
                              "horse", "student", "bird", "king",   "child",   "sailor"};
const char* const kVerbs[] = {"sees", "finds", "likes", "follows", "helps", "watches", "calls"};
const char* const kPast[] = {"walked", "slept", "waited", "sang", "laughed", "rested", "worked"};
const char* const kPlaces[] = {"house", "garden", "market", "forest", "village", "bridge", "hill"};
const char* const kAdverbs[] = {"slowly", "happily", "again", "today", "at night", "all day"};

std::string sentence(Words& w) {
  std::string s;
  switch (w.next() % 4) {
    case 0:
      s = std::string("The ") + w.pick(kAdjectives) + " " + w.pick(kNouns) + " " + w.pick(kVerbs) +
          " the " + w.pick(kNouns) + " near the " + w.pick(kPlaces) + ".";
      break;
    case 1:
      s = std::string("A ") + w.pick(kNouns) + " " + w.pick(kPast) + " in the " + w.pick(kPlaces) +
          " " + w.pick(kAdverbs) + ".";
      break;
    case 2:
      s = std::string("Why does the ") + w.pick(kNouns) + " " + w.pick(kPast) + " so " +
          w.pick(kAdverbs) + "?";
      break;
    default:
      s = std::string("Every ") + w.pick(kAdjectives) + " " + w.pick(kNouns) + " " +
          w.pick(kVerbs) + " a " + w.pick(kAdjectives) + " " + w.pick(kNouns) + ".";
  }
  return s;
}

int64_t shard_tokens(const fs::path& bin) {
  return static_cast<int64_t>((fs::file_size(bin) - 32) / 2);
}

}  // namespace

std::string generated_corpus(int records) {
  Words w(42);
  std::string text;
  for (int r = 0; r < records; ++r) {
    const int sentences = 1 + static_cast<int>(w.next() % 3);
    for (int k = 0; k < sentences; ++k) text += sentence(w) + (k + 1 < sentences ? " " : "\n");
    text += "%\n";
  }
  return text;
}

std::vector<Record> generated_records(int records) {
  const std::string text = generated_corpus(records);
  std::vector<Record> out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find("%\n", at);
    const std::string record = text.substr(at, end - at);
    out.push_back({record, record.find('?') != std::string::npos});
    at = end + 2;
  }
  return out;
}

// The real `dtrain data tokenize` on a generated corpus, vocabulary 300.
TokenDir tokenize(const fs::path& tmp, int records) {
  const fs::path text = tmp / "corpus.txt";
  write_bytes(text, generated_corpus(records));
  TokenDir t;
  t.dir = tmp / "tokens";
  const RunResult r =
      run_dtrain_command({"data", "tokenize", "--input", text.string(), "--vocab-size", "300",
                          "--val-fraction", "0.1", "--out", t.dir.string()},
                         tmp / "tokenize.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const auto tok = nlohmann::json::parse(std::ifstream(t.dir / "tokenizer.json"));
  t.vocab = tok.at("vocab_size").get<int64_t>();
  REQUIRE(t.vocab == 300);
  t.train_tokens = shard_tokens(t.dir / "train.bin");
  t.val_tokens = shard_tokens(t.dir / "val.bin");
  return t;
}

TokenDir tokenize_labelled(const fs::path& tmp, int records, const std::string& out,
                           const fs::path& tokenizer) {
  std::string questions, statements;
  for (const Record& r : generated_records(records))
    (r.question ? questions : statements) += r.text + "%\n";
  const fs::path dir = tmp / "labelled";
  fs::create_directories(dir);
  write_bytes(dir / "questions", questions);
  write_bytes(dir / "statements", statements);
  TokenDir t;
  t.dir = tmp / out;
  std::vector<std::string> args = {"data",
                                   "tokenize",
                                   "--labelled",
                                   "--input",
                                   (dir / "questions").string(),
                                   "--input",
                                   (dir / "statements").string(),
                                   "--val-fraction",
                                   "0.1",
                                   "--out",
                                   t.dir.string()};
  if (tokenizer.empty()) {
    args.insert(args.end(), {"--vocab-size", "300"});
  } else {
    args.insert(args.end(), {"--tokenizer", tokenizer.string()});
  }
  const RunResult r = run_dtrain_command(args, tmp / (out + ".log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const auto tok = nlohmann::json::parse(std::ifstream(t.dir / "tokenizer.json"));
  t.vocab = tok.at("vocab_size").get<int64_t>();
  t.train_tokens = shard_tokens(t.dir / "train.bin");
  t.val_tokens = shard_tokens(t.dir / "val.bin");
  return t;
}

fs::path classifier_job(const fs::path& dir, const std::string& run, const TokenDir& data,
                        int steps) {
  const fs::path job = dir / (run + ".yaml");
  std::ofstream(job) << "run: {output_dir: " << (dir / run).string() << ", seed: 1}\n"
                     << "model: {arch: bert-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 64,\n"
                     << "        max_positions: 64, vocab_size: " << data.vocab
                     << ", num_classes: 2, dropout: 0.1}\n"
                     << "data: {dataset: tokens, path: " << data.dir.string()
                     << ", global_batch: 16}\n"
                     << "optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}\n"
                     << "train: {steps: " << steps << ", log_every: 10, eval_every: " << steps
                     << "}\n"
                     << "logging: {console: false}\n";
  return job;
}

fs::path gpt_job(const fs::path& dir, const std::string& run, const TokenDir& data, int steps) {
  const fs::path job = dir / (run + ".yaml");
  std::ofstream(job) << "run: {output_dir: " << (dir / run).string() << ", seed: 1}\n"
                     << "model: {arch: gpt2-tiny, layers: 2, hidden: 32, heads: " << kGptHeads
                     << ",\n        seq_len: " << kGptContext << ", max_positions: " << kGptContext
                     << ", vocab_size: " << data.vocab << ", dropout: 0.1}\n"
                     << "data: {dataset: tokens, path: " << data.dir.string()
                     << ", global_batch: 8}\n"
                     << "optimizer: {name: adamw, lr: 0.01}\n"
                     << "train: {steps: " << steps
                     << ", log_every: 10, checkpoint: {every: 10, keep: 5}}\n"
                     << "logging: {console: false}\n";
  return job;
}

}  // namespace dtrain::train_test
