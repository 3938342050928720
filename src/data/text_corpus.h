// Plain-text corpora for `dtrain data tokenize`: which files of the inputs are
// read, how they split into documents, and the deterministic train/validation
// split. Produces bytes and document boundaries only; tokenizing is tokenizer.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace dtrain {

// Inputs are files or directories (searched recursively, in path order). In a
// directory, hidden names, *.dat (strfile indexes of fortune files) and *.u8
// (fortune's UTF-8 aliases, symlinks to the same text) are skipped, and so is any
// file holding a NUL byte (binary); a file named directly must be text. The same
// file reached twice (symlinks) is read once. Files may be gzip-compressed.
// Documents: a file with a line that is exactly "%" is a fortune file whose
// records (the text between such lines) are documents; any other file is one
// document. Documents of only whitespace are dropped.
struct TextCorpus {
  std::vector<std::string> files;                // read, in order
  std::vector<std::string> skipped;              // directory entries passed over
  std::string text;                              // every document's bytes, back to back
  std::vector<std::pair<size_t, size_t>> spans;  // (offset, length) of each document in text
  std::string_view document(size_t i) const {
    return std::string_view(text).substr(spans[i].first, spans[i].second);
  }
  int64_t documents() const { return static_cast<int64_t>(spans.size()); }
  int64_t bytes() const { return static_cast<int64_t>(text.size()); }
};
TextCorpus read_text_corpus(const std::vector<std::string>& inputs);

// Text classification (`dtrain data tokenize --labelled`): each input, a file or a
// directory read by the rules above, is one class, named by its file name (without
// the extension for a file, and a .gz before it): `--input reviews/pos --input reviews/neg`, or
// fortune files by topic. Classes take ids in input order; every document of an input has its
// class. At least two classes, each with a document; names and files are not shared.
struct LabelledCorpus {
  TextCorpus corpus;
  std::vector<int32_t> labels;     // per document of corpus
  std::vector<std::string> names;  // per class id
};
// One input that is a rows file (is_labelled_rows_file) is read by read_labelled_rows.
LabelledCorpus read_labelled_corpus(const std::vector<std::string>& inputs);
// Labelled rows in one file (optionally .gz): JSON Lines, one {"text": ..., "label": ...}
// object per line (label a string or a whole number; other keys ignored); TSV, one
// label, a tab and the text (the rest of the line) per line; or CSV (RFC 4180: a header
// naming a "text" and a "label" column among any others, fields quoted with '"' where
// they hold a comma, a quote (doubled) or a line break). Blank lines are skipped; a row
// without a text, or a malformed one, is an Error naming the file and line. Each row is
// one document. Classes are the distinct labels in a fixed order: by value when every
// label is a whole number (so 0, 1, 2 keep their ids), else by their bytes.
enum class RowFormat : uint8_t { jsonl, tsv, csv };
// The format a rows file's name says (.jsonl, .tsv, .csv, each optionally .gz), if any.
std::optional<RowFormat> row_format_of(const std::string& name);
bool is_labelled_rows_file(const std::string& input);  // an existing rows file
LabelledCorpus read_labelled_rows(const std::string& file);
// The same file's rows as they stand, in file order (`dtrain predict` scores a model on them).
struct LabelledRow {
  std::string label;
  std::string text;
  int64_t line = 0;  // 1-based
};
std::vector<LabelledRow> read_labelled_row_list(const std::string& file);
// The same from a file's contents (`file` names it in errors).
std::vector<LabelledRow> parse_labelled_rows(std::string_view contents, RowFormat format,
                                             const std::string& file);
// The documents (and their labels) in an order drawn from `seed` (epoch_order's
// permutation), so that the classes are interleaved in the shards: data.limit's first
// texts then hold every class, not the first input's alone.
void interleave_classes(LabelledCorpus& c, uint64_t seed);

// Document i goes to validation when the first word of Philox(seed, (doc_split, i))
// is below fraction * 2^32. With 0 < fraction and at least two documents, each
// side keeps at least one (the lowest draw moves to validation, the highest to train).
enum class DocSplit : uint8_t { train, validation };
std::vector<DocSplit> split_documents(int64_t documents, uint64_t seed, double fraction);

// The documents of one side as one token stream: <|endoftext|> before each
// document (GPT-2's convention, as in llm.c), then its tokens.
std::vector<TokenId> encode_documents(const Tokenizer& tokenizer, const TextCorpus& corpus,
                                      const std::vector<DocSplit>& split, DocSplit side);

}  // namespace dtrain
