// Input discovery, the file rules, fortune records and the document split for
// `dtrain data tokenize` (rules in text_corpus.h).
#include "data/text_corpus.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "data/file_bytes.h"
#include "data/rng_streams.h"
#include "data/sampler.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInputHint = "pass text files, or directories holding them, to --input";

bool skipped_name(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.empty() || name[0] == '.' || p.extension() == ".dat" || p.extension() == ".u8";
}

// Regular files under `dir`, sorted, without the skipped names.
std::vector<fs::path> files_under(const std::string& dir, std::vector<std::string>& skipped) {
  std::vector<fs::path> out;
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot list: {}", dir, ec.message()), kInputHint);
  for (const fs::directory_entry& e : it) {
    if (!e.is_regular_file(ec)) continue;
    if (skipped_name(e.path())) {
      skipped.push_back(e.path().string());
      continue;
    }
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_separator(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line == "%";
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xe  ? 3
                     : (c >> 3) == 0x1e ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  });
}

// Appends the documents of one file's text to the corpus (a UTF-8 byte-order mark at its
// start is no part of them).
void add_documents(TextCorpus& corpus, std::string_view text) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  std::vector<std::string_view> records;
  size_t start = 0;
  bool fortune = false;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    end = end == std::string_view::npos ? text.size() : end + 1;
    std::string_view line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (is_separator(line)) {
      fortune = true;
      records.push_back(text.substr(start, at - start));
      start = end;
    }
    at = end;
  }
  records.push_back(text.substr(start));
  if (!fortune) records = {text};
  for (std::string_view r : records) {
    if (blank(r)) continue;
    corpus.spans.emplace_back(corpus.text.size(), r.size());
    corpus.text += r;
  }
}

}  // namespace

TextCorpus read_text_corpus(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw Error("no input files", kInputHint);
  TextCorpus corpus;
  std::set<std::string> seen;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (!fs::exists(st))
      throw Error(fmt::format("{}: no such file or directory", input), kInputHint);
    const bool dir = fs::is_directory(st);
    std::vector<fs::path> files =
        dir ? files_under(input, corpus.skipped) : std::vector<fs::path>{fs::path(input)};
    for (const fs::path& file : files) {
      const std::string canonical = fs::weakly_canonical(file, ec).string();
      if (!seen.insert(ec ? file.string() : canonical).second) continue;
      const FileBytes f = read_file_bytes(file.string(), kInputHint);
      const auto nul = std::find(f.bytes.begin(), f.bytes.end(), uint8_t{0});
      if (nul != f.bytes.end()) {
        if (dir) {
          corpus.skipped.push_back(file.string());
          continue;
        }
        throw Error(fmt::format("{}: holds a NUL byte, so it is binary, not text",
                                f.where(static_cast<uint64_t>(nul - f.bytes.begin()))),
                    kInputHint);
      }
      corpus.files.push_back(file.string());
      add_documents(
          corpus, std::string_view(reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size()));
    }
  }
  if (corpus.spans.empty())
    throw Error(fmt::format("no text in {} ({} files read, {} skipped)", fmt::join(inputs, ", "),
                            corpus.files.size(), corpus.skipped.size()),
                kInputHint);
  return corpus;
}

namespace {

constexpr const char* kRowsHint =
    "a .jsonl file holds one {\"text\": ..., \"label\": ...} object per line (label a "
    "string or a whole number); a .tsv file one label, a tab and the text per line; a .csv "
    "file a header naming its \"text\" and \"label\" columns, then one row per record";

// The file name without .gz: "train.jsonl.gz" -> "train.jsonl".
fs::path without_gz(const fs::path& p) { return p.extension() == ".gz" ? p.stem() : p.filename(); }

bool whole_number(std::string_view s) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [at, ec] = std::from_chars(s.data(), end, v);
  return !s.empty() && ec == std::errc() && at == end;
}

// One row's label and text, or an Error naming the file and line.
std::pair<std::string, std::string_view> parse_row(std::string_view line, bool jsonl,
                                                   const std::string& where,
                                                   std::string& json_text) {
  if (!jsonl) {
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos)
      throw Error(fmt::format("{}: no tab between the label and the text", where), kRowsHint);
    return {std::string(line.substr(0, tab)), line.substr(tab + 1)};
  }
  const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
  if (!row.is_object() || !row.contains("text") || !row.contains("label") ||
      !row.at("text").is_string()) {
    throw Error(fmt::format("{}: not an object with a string \"text\" and a \"label\"", where),
                kRowsHint);
  }
  const nlohmann::json& label = row.at("label");
  std::string name;
  if (label.is_string()) {
    name = label.get<std::string>();
  } else if (label.is_number_integer()) {
    name = std::to_string(label.get<int64_t>());
  } else {
    throw Error(
        fmt::format("{}: label {} is neither a string nor a whole number", where, label.dump()),
        kRowsHint);
  }
  json_text = row.at("text").get<std::string>();
  return {name, json_text};
}

}  // namespace

std::optional<RowFormat> row_format_of(const std::string& name) {
  const fs::path ext = without_gz(fs::path(name)).extension();
  if (ext == ".jsonl") return RowFormat::jsonl;
  if (ext == ".tsv") return RowFormat::tsv;
  if (ext == ".csv") return RowFormat::csv;
  return std::nullopt;
}

bool is_labelled_rows_file(const std::string& input) {
  std::error_code ec;
  return fs::is_regular_file(input, ec) && row_format_of(input).has_value();
}

std::vector<LabelledRow> read_labelled_row_list(const std::string& file) {
  const FileBytes f = read_file_bytes(file, kRowsHint);
  return parse_labelled_rows(f.text(), row_format_of(file).value_or(RowFormat::tsv), file);
}

namespace {

// CSV records (RFC 4180), each with the line it starts on; a quoted field may span lines.
std::vector<std::pair<std::vector<std::string>, int64_t>> csv_records(std::string_view text,
                                                                      const std::string& file) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a byte-order mark
  std::vector<std::pair<std::vector<std::string>, int64_t>> out;
  std::vector<std::string> fields;
  std::string field;
  int64_t line = 1, start = 1;
  bool quoted = false, was_quoted = false, any = false, quoted_any = false;
  const auto end_record = [&] {
    fields.push_back(std::move(field));
    field.clear();
    // A blank line, or one of bare commas (a spreadsheet's trailing empty rows), is no
    // record.
    const bool empty = !quoted_any && std::all_of(fields.begin(), fields.end(),
                                                  [](const std::string& f) { return f.empty(); });
    if (!empty) out.emplace_back(std::move(fields), start);
    quoted_any = false;
    fields.clear();
    was_quoted = false;
    any = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (!any) start = line;
    any = true;
    if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = quoted_any = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      end_record();
      ++line;
    } else if (was_quoted) {
      throw Error(
          fmt::format("{}:{}: a character after a quoted field's closing quote", file, line),
          "quote the whole field, and double each quote inside it (\"\")");
    } else {
      field += c;
    }
  }
  if (quoted) {
    throw Error(
        fmt::format("{}:{}: a quoted field is not closed before the end of the file", file, start),
        "close the field with a quote, and double each quote inside it (\"\")");
  }
  if (any) end_record();
  return out;
}

std::vector<LabelledRow> csv_rows(std::string_view contents, const std::string& file) {
  const auto records = csv_records(contents, file);
  if (records.empty()) return {};
  const std::vector<std::string>& header = records.front().first;
  const auto column = [&](const char* name) {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      std::string names;
      for (const std::string& h : header) names += (names.empty() ? "" : ", ") + h;
      throw Error(fmt::format("{}:{}: the header ({}) has no \"{}\" column", file,
                              records.front().second, names, name),
                  "the first row of a .csv file names its columns: one \"text\", one "
                  "\"label\" (others are ignored)");
    }
    return static_cast<size_t>(it - header.begin());
  };
  const size_t text_at = column("text"), label_at = column("label");
  std::vector<LabelledRow> rows;
  for (size_t r = 1; r < records.size(); ++r) {
    const auto& [fields, line] = records[r];
    const std::string where = fmt::format("{}:{}", file, line);
    if (fields.size() != header.size()) {
      throw Error(
          fmt::format("{}: {} field(s), the header names {}", where, fields.size(), header.size()),
          "quote a field that holds a comma, and double each quote inside it (\"\")");
    }
    rows.push_back({fields[label_at], fields[text_at], line});
  }
  return rows;
}

}  // namespace

std::vector<LabelledRow> parse_labelled_rows(std::string_view contents, RowFormat format,
                                             const std::string& file) {
  std::vector<LabelledRow> rows;
  if (format == RowFormat::csv) {
    rows = csv_rows(contents, file);
  } else {
    const bool jsonl = format == RowFormat::jsonl;
    std::string json_text;
    for_each_line(contents, [&](std::string_view line, int64_t line_no) {
      if (blank(line)) return;  // a blank line (a last newline, say) is no row
      const auto [label, text] =
          parse_row(line, jsonl, fmt::format("{}:{}", file, line_no), json_text);
      rows.push_back({label, std::string(text), line_no});
    });
  }
  for (const LabelledRow& row : rows) {  // every format's rows, by the same rules
    const std::string where = fmt::format("{}:{}", file, row.line);
    if (row.label.empty() || !valid_utf8(row.label))
      throw Error(fmt::format("{}: the label is empty or not UTF-8 text", where), kRowsHint);
    if (blank(row.text)) {
      throw Error(fmt::format("{}: the text is empty", where),
                  "remove the row: a classifier learns nothing from it");
    }
  }
  return rows;
}

LabelledCorpus read_labelled_rows(const std::string& file) {
  const std::vector<LabelledRow> rows = read_labelled_row_list(file);
  // Classes in a fixed order, whatever the rows' order: whole numbers by value, else by
  // their bytes. Labels 0, 1, 2 keep those ids.
  std::vector<std::string> names;
  for (const LabelledRow& row : rows) names.push_back(row.label);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  if (std::all_of(names.begin(), names.end(), whole_number)) {
    std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
      const int64_t x = std::stoll(a), y = std::stoll(b);
      return x != y ? x < y : a < b;  // "7" and "07" apart, in a fixed order
    });
  }
  if (names.size() < 2) {
    throw Error(fmt::format("{}: {} row(s), all of one class; a classifier needs at least two",
                            file, rows.size()),
                kRowsHint);
  }
  std::map<std::string, int32_t> id;
  for (size_t i = 0; i < names.size(); ++i) id[names[i]] = static_cast<int32_t>(i);
  LabelledCorpus out;
  for (const LabelledRow& row : rows) {
    out.corpus.spans.emplace_back(out.corpus.text.size(), row.text.size());
    out.corpus.text += row.text;
    out.labels.push_back(id.at(row.label));
  }
  out.names = names;
  out.corpus.files.push_back(file);
  return out;
}

LabelledCorpus read_labelled_corpus(const std::vector<std::string>& inputs) {
  if (inputs.size() == 1 && is_labelled_rows_file(inputs[0])) return read_labelled_rows(inputs[0]);
  if (inputs.size() < 2) {
    throw Error(fmt::format("--labelled: {} input(s); each input is one class, and a classifier "
                            "needs at least two",
                            inputs.size()),
                "pass one --input per class, e.g. --input reviews/pos --input reviews/neg, or one "
                ".jsonl, .tsv or .csv file of labelled rows");
  }
  LabelledCorpus out;
  std::map<std::string, std::string> file_class;  // each file read, and the class it went to
  for (const std::string& input : inputs) {
    if (is_labelled_rows_file(input)) {
      throw Error(fmt::format("--labelled: {} holds labelled rows, but {} inputs make classes",
                              input, inputs.size()),
                  "pass a .jsonl, .tsv or .csv file of rows as the only --input");
    }
    const fs::path p = fs::path(input).lexically_normal();
    const fs::path base = p.has_filename() ? p : p.parent_path();
    // A file's name without its extension, and without .gz first (neg.txt.gz: neg).
    const fs::path file = base.extension() == ".gz" ? base.stem() : base;
    std::error_code ec;
    const std::string name =
        fs::is_directory(input, ec) ? base.filename().string() : file.stem().string();
    if (!valid_utf8(name)) {
      throw Error(fmt::format("--labelled: the class name of {} is not UTF-8 text", input),
                  "labels.json holds the class names as JSON strings: rename the file or "
                  "directory");
    }
    if (std::find(out.names.begin(), out.names.end(), name) != out.names.end()) {
      throw Error(fmt::format("--labelled: two inputs make the class \"{}\" ({})", name, input),
                  "each input's file name names its class: give the classes distinct names");
    }
    const TextCorpus one = read_text_corpus({input});
    for (const std::string& f : one.files) {
      std::error_code ec;
      const std::string key = fs::weakly_canonical(f, ec).string();
      const auto [it, fresh] = file_class.emplace(ec ? f : key, name);
      if (!fresh) {
        throw Error(fmt::format("--labelled: {} is read for class \"{}\" and for class \"{}\"", f,
                                it->second, name),
                    "a text belongs to one class: keep the classes' files apart");
      }
    }
    const auto id = static_cast<int32_t>(out.names.size());
    out.names.push_back(name);
    for (const auto& [offset, length] : one.spans) {
      out.corpus.spans.emplace_back(out.corpus.text.size() + offset, length);
      out.labels.push_back(id);
    }
    out.corpus.text += one.text;
    out.corpus.files.insert(out.corpus.files.end(), one.files.begin(), one.files.end());
    out.corpus.skipped.insert(out.corpus.skipped.end(), one.skipped.begin(), one.skipped.end());
  }
  return out;
}

void interleave_classes(LabelledCorpus& c, uint64_t seed) {
  std::vector<int64_t> order;
  epoch_order(c.corpus.documents(), seed, 0, Shuffle::on, order);
  std::vector<std::pair<size_t, size_t>> spans(order.size());
  std::vector<int32_t> labels(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    spans[i] = c.corpus.spans[static_cast<size_t>(order[i])];
    labels[i] = c.labels[static_cast<size_t>(order[i])];
  }
  c.corpus.spans = std::move(spans);
  c.labels = std::move(labels);
}

std::vector<DocSplit> split_documents(int64_t documents, uint64_t seed, double fraction) {
  DTRAIN_CHECK(documents >= 0 && fraction >= 0 && fraction < 1, "{} documents, fraction {}",
               documents, fraction);
  const auto threshold = static_cast<uint64_t>(std::llround(fraction * 0x1p32));
  std::vector<DocSplit> out(static_cast<size_t>(documents), DocSplit::train);
  std::vector<uint32_t> draw(out.size());
  int64_t val = 0;
  for (int64_t i = 0; i < documents; ++i) {
    draw[i] = Philox(seed, rng_stream_id(data_rng::kDocSplit, 0, static_cast<uint64_t>(i))).u32(0);
    if (draw[i] < threshold) {
      out[i] = DocSplit::validation;
      ++val;
    }
  }
  if (fraction <= 0 || documents < 2) return out;
  if (val == 0)
    out[std::min_element(draw.begin(), draw.end()) - draw.begin()] = DocSplit::validation;
  if (val == documents)
    out[std::max_element(draw.begin(), draw.end()) - draw.begin()] = DocSplit::train;
  return out;
}

std::vector<TokenId> encode_documents(const Tokenizer& tokenizer, const TextCorpus& corpus,
                                      const std::vector<DocSplit>& split, DocSplit side) {
  DTRAIN_CHECK(split.size() == corpus.spans.size());
  std::vector<TokenId> out;
  const TokenId eot = tokenizer.special(Special::endoftext);
  for (size_t i = 0; i < split.size(); ++i) {
    if (split[i] != side) continue;
    out.push_back(eot);
    tokenizer.encode_append(corpus.document(i), out);
  }
  return out;
}

}  // namespace dtrain
