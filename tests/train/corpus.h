// An English-like generated corpus (the same on every machine) and its
// tokenization by `dtrain data tokenize`, for the language-model tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"

namespace dtrain::train_test {

// `records` fortune-style records of 1-3 sentences with "%" lines between them,
// so `dtrain data tokenize` reads each record as one document.
std::string generated_corpus(int records);

// The same records one by one (without their "%" lines), each with whether it asks a
// question: the two classes of the classifier tests.
struct Record {
  std::string text;
  bool question = false;
};
std::vector<Record> generated_records(int records);

struct TokenDir {
  fs::path dir;
  int64_t vocab = 0;         // tokenizer.json's vocab_size
  int64_t train_tokens = 0;  // in train.bin (u16 tokens after a 32-byte header)
  int64_t val_tokens = 0;
};

// The real `dtrain data tokenize` on a generated corpus, vocabulary 300.
TokenDir tokenize(const fs::path& tmp, int records);

// The same records as two classes, for a classifier: those that ask a question
// (tmp/labelled/questions) and the others (tmp/labelled/statements), tokenized by
// `dtrain data tokenize --labelled` into tmp/<out>, vocabulary 300 (or with
// `--tokenizer` an earlier run's tokenizer.json, when given).
TokenDir tokenize_labelled(const fs::path& tmp, int records,
                           const std::string& out = "labelled-tokens",
                           const fs::path& tokenizer = {});

// A one-layer, width-32 BERT classifier of 2 classes over `data`, 64-token rows (the
// longest records are cut).
fs::path classifier_job(const fs::path& dir, const std::string& run, const TokenDir& data,
                        int steps);

// A two-layer GPT-2 of width 32 and context 16 over `data`, trained `steps` steps
// (checkpoints every 10), at <dir>/<run>.yaml.
inline constexpr int64_t kGptContext = 16;
inline constexpr int kGptHeads = 2;
fs::path gpt_job(const fs::path& dir, const std::string& run, const TokenDir& data, int steps);

}  // namespace dtrain::train_test
