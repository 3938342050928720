// `dtrain predict JOB.yaml [--text TEXT ...] [--input FILE [--format F]] [--checkpoint
// PATH] [--tokenizer F] [--top N] [--batch N] [--device D] [--json] [--set key=value ...]`:
// a BERT classifier's classes for texts, a masked-LM BERT's fill-mask, or a GPT-2's
// scores (runtime/predict.h). --input reads one text per line, or labelled rows (.jsonl /
// .tsv, as `dtrain data tokenize --labelled` reads them), which also score the
// classifier: accuracy, and per class.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "data/file_bytes.h"
#include "data/image_file.h"
#include "data/text_corpus.h"
#include "models/options.h"
#include "runtime/job.h"
#include "runtime/predict.h"

namespace dtrain::cli {
namespace {

struct PredictArgs {
  std::string job;
  std::vector<std::string> overrides;
  std::vector<std::string> texts;
  std::string input, format = "auto", checkpoint, tokenizer, device;
  std::string which_weights = "auto";
  std::vector<std::string> images;  // image models: files and directories
  std::string split;                // image models: "test"
  int64_t top = 0;                  // unset: 5 for fill-mask
  int64_t batch = 0;                // auto
  bool json = false;
};

struct Inputs {
  std::vector<std::string> texts;
  std::vector<std::optional<std::string>> labels;  // per text: its row's label, if it had one
  std::vector<std::string> where;                  // per text: "--text 2", "rows.tsv:7"
};

constexpr const char* kInputHint =
    "--input takes one text per line, or labelled rows in a .jsonl ({\"text\": ..., \"label\": "
    "...} per line), .tsv (label, tab, text) or .csv (a header naming \"text\" and "
    "\"label\") file (--format says which for standard input, -, or another name)";

// --format: how --input reads. auto: labelled rows by the file's name (.jsonl, .tsv,
// .csv, each optionally .gz'ed), else one text per line (nullopt).
std::optional<RowFormat> input_format(const PredictArgs& a) {
  if (a.format == "lines") return std::nullopt;
  if (a.format == "tsv") return RowFormat::tsv;
  if (a.format == "jsonl") return RowFormat::jsonl;
  if (a.format == "csv") return RowFormat::csv;
  return row_format_of(a.input);
}

Inputs read_inputs(const PredictArgs& a) {
  Inputs in;
  for (size_t i = 0; i < a.texts.size(); ++i) {
    in.texts.push_back(a.texts[i]);
    in.labels.emplace_back();
    in.where.push_back(fmt::format("--text {}", i + 1));
  }
  if (a.input.empty()) return in;
  std::error_code ec;
  if (std::filesystem::is_directory(a.input, ec))
    throw Error(fmt::format("--input {}: a directory, not a file of texts", a.input), kInputHint);
  std::string contents;
  if (a.input == "-") {
    std::ostringstream s;
    s << std::cin.rdbuf();
    contents = s.str();
  } else {
    contents = std::string(read_file_bytes(a.input, kInputHint).text());
  }
  const std::string name = a.input == "-" ? "stdin" : a.input;
  if (const std::optional<RowFormat> format = input_format(a)) {
    for (LabelledRow& row : parse_labelled_rows(contents, *format, name)) {
      in.texts.push_back(std::move(row.text));
      in.labels.emplace_back(std::move(row.label));
      in.where.push_back(fmt::format("{}:{}", name, row.line));
    }
    if (in.labels.empty() || !in.labels.back())
      throw Error(fmt::format("--input {}: no rows in it", a.input), kInputHint);
    return in;
  }
  int64_t tabbed = 0, objects = 0, lines = 0;
  for_each_line(contents, [&](std::string_view line, int64_t number) {
    if (line.find_first_not_of(" \t\r\v\f") == std::string_view::npos) return;  // blank
    ++lines;
    tabbed += line.find('\t') != std::string_view::npos ? 1 : 0;
    objects += line.front() == '{' && line.back() == '}' ? 1 : 0;
    in.texts.emplace_back(line);
    in.labels.emplace_back();
    in.where.push_back(fmt::format("{}:{}", name, number));
  });
  if (lines == 0) {
    throw Error(fmt::format("--input {}: no texts in it (every line is blank)", a.input),
                kInputHint);
  }
  if (a.format == "auto" && lines > 1 && (tabbed == lines || objects == lines)) {
    std::fprintf(stderr,
                 "dtrain: warning: every line of %s looks like a labelled row (%s), but each is "
                 "read as one text: --format %s reads them as rows\n",
                 name.c_str(), tabbed == lines ? "label, tab, text" : "a JSON object",
                 tabbed == lines ? "tsv" : "jsonl");
  }
  return in;
}

// The bytes of a UTF-8 character starting at s[i] (1 to 4), or 0 when none starts there.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t n = c < 0x80           ? 1
                   : (c >> 5) == 0x6  ? 2
                   : (c >> 4) == 0xE  ? 3
                   : (c >> 3) == 0x1E ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// A text on one console line: control characters as spaces, bytes that are no UTF-8
// character (a byte-level token can be half of one) as U+FFFD, cut after 80 characters.
std::string one_line(std::string_view text) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n == 0) {
      chars.emplace_back("\xEF\xBF\xBD");
    } else if (n == 1 && (static_cast<unsigned char>(text[i]) < 0x20 || text[i] == 0x7F)) {
      chars.emplace_back(" ");
    } else {
      chars.emplace_back(text.substr(i, n));
    }
    i += std::max<size_t>(n, 1);
  }
  const bool cut = chars.size() > 80;
  if (cut) chars.resize(77);
  std::string s;
  for (const std::string& c : chars) s += c;
  return cut ? s + "..." : s;
}

// Each text's class id by its row's label (-1: no label), checked before any forward:
// labels are the model's class names for a classifier, any names for a GPT-2 (its
// perplexity is also given per label), and a masked-LM takes none.
std::vector<int32_t> expected_classes(const Job& job, const std::string& tokenizer,
                                      const Inputs& in) {
  std::vector<int32_t> expected(in.texts.size(), -1);
  if (find_arch(job.model.arch)->family == ModelFamily::gpt) return expected;
  const std::vector<std::string> classes =
      job.model.num_classes ? runtime::class_names(job, tokenizer) : std::vector<std::string>{};
  std::map<std::string, int32_t> id;
  for (size_t k = 0; k < classes.size(); ++k) id[classes[k]] = static_cast<int32_t>(k);
  for (size_t i = 0; i < in.texts.size(); ++i) {
    if (!in.labels[i]) continue;
    if (classes.empty()) {
      throw Error(fmt::format("{}: labelled rows score a classifier (or a GPT-2, per label), "
                              "and the job's model is a masked-LM BERT",
                              in.where[i]),
                  "pass a file of texts with [MASK]s, one per line");
    }
    auto it = id.find(*in.labels[i]);
    if (it == id.end()) {
      std::string names;
      for (const std::string& c : classes) names += (names.empty() ? "" : ", ") + c;
      throw Error(fmt::format("{}: label \"{}\" is none of the model's classes ({})", in.where[i],
                              *in.labels[i], names),
                  "label rows with the class names the model was trained on (data.path's "
                  "labels.json)");
    }
    expected[i] = it->second;
  }
  return expected;
}

// The score of a classifier over the labelled texts: correct / labelled, and per class.
struct Score {
  int64_t labelled = 0, correct = 0;
  std::vector<int64_t> per_class, right_per_class;
};

Score score(const runtime::PredictResult& p, const std::vector<int32_t>& expected) {
  Score s;
  s.per_class.assign(p.classes.size(), 0);
  s.right_per_class.assign(p.classes.size(), 0);
  for (size_t i = 0; i < expected.size(); ++i) {
    const int32_t want = expected[i];
    if (want < 0) continue;
    ++s.labelled;
    ++s.per_class[static_cast<size_t>(want)];
    if (p.texts[i].label == want) {
      ++s.correct;
      ++s.right_per_class[static_cast<size_t>(want)];
    }
  }
  return s;
}

// A GPT-2's scores over texts: the scored tokens, their log-probabilities' sum, and the
// perplexity exp(-mean log-probability); nullopt without a scored token.
struct Perplexity {
  int64_t tokens = 0;
  double logprob = 0.0;
  void add(const Perplexity& o) {
    tokens += o.tokens;
    logprob += o.logprob;
  }
  std::optional<double> value() const {
    if (tokens == 0) return std::nullopt;
    return std::exp(-logprob / static_cast<double>(tokens));
  }
};

Perplexity perplexity(const std::vector<double>& logprobs) {
  Perplexity p;
  for (double l : logprobs) p.logprob += l;
  p.tokens = static_cast<int64_t>(logprobs.size());
  return p;
}

nlohmann::json or_null(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nullptr; }

// A GPT-2's perplexity per label of labelled rows (empty without labels).
std::map<std::string, Perplexity> per_label(const runtime::PredictResult& p, const Inputs& in) {
  std::map<std::string, Perplexity> out;
  for (size_t i = 0; i < p.texts.size(); ++i) {
    if (!in.labels[i]) continue;
    out[*in.labels[i]].add(perplexity(p.texts[i].logprobs));
  }
  return out;
}

const char* task_name(runtime::PredictTask t) {
  switch (t) {
    case runtime::PredictTask::classify:
      return "classify";
    case runtime::PredictTask::fill_mask:
      return "fill-mask";
    case runtime::PredictTask::score:
      return "score";
  }
  return "?";
}

nlohmann::json to_json(const runtime::PredictResult& p, const Inputs& in, const Score& s) {
  const bool classify = p.task == runtime::PredictTask::classify;
  nlohmann::json texts = nlohmann::json::array();
  Perplexity all;
  for (size_t i = 0; i < p.texts.size(); ++i) {
    const runtime::TextPrediction& t = p.texts[i];
    nlohmann::json j = {{"text", in.texts[i]}, {"tokens", t.tokens}, {"ids", t.ids}};
    if (p.task == runtime::PredictTask::score) {
      const Perplexity one = perplexity(t.logprobs);
      all.add(one);
      j["logprobs"] = t.logprobs;
      j["logprob"] = one.logprob;
      j["perplexity"] = or_null(one.value());
      j["windows"] = t.windows;
    } else if (classify) {
      j["label"] = p.classes[static_cast<size_t>(t.label)];
      j["label_id"] = t.label;
      j["probabilities"] = t.probabilities;  // in the order of "classes"
      j["cut"] = t.cut;
      if (in.labels[i]) j["expected"] = *in.labels[i];
    } else {
      nlohmann::json masks = nlohmann::json::array();
      for (const auto& m : t.masks) {
        nlohmann::json top = nlohmann::json::array();
        for (const runtime::TokenScore& c : m)
          top.push_back({{"id", c.id}, {"token", c.token}, {"probability", c.probability}});
        masks.push_back(top);
      }
      j["masks"] = masks;
      j["filled"] = t.filled;
    }
    texts.push_back(j);
  }
  nlohmann::json out = {{"task", task_name(p.task)},
                        {"weights", p.weights},
                        {"ema", p.ema},
                        {"step", p.step >= 0 ? nlohmann::json(p.step) : nullptr},
                        {"forwards", p.forwards},
                        {"seconds", p.seconds}};
  if (p.task == runtime::PredictTask::fill_mask) out["mask_id"] = p.mask_id;
  if (p.task == runtime::PredictTask::score) {
    out["scored_tokens"] = all.tokens;
    out["logprob"] = all.logprob;
    out["perplexity"] = or_null(all.value());
    const std::map<std::string, Perplexity> labels = per_label(p, in);
    if (!labels.empty()) {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& [label, l] : labels)
        j[label] = {{"scored_tokens", l.tokens}, {"perplexity", or_null(l.value())}};
      out["per_label"] = j;
    }
  }
  if (classify) {
    out["classes"] = p.classes;
    if (s.labelled > 0) {
      out["labelled"] = s.labelled;
      out["correct"] = s.correct;
      out["accuracy"] = static_cast<double>(s.correct) / static_cast<double>(s.labelled);
      nlohmann::json per_class = nlohmann::json::object();
      for (size_t k = 0; k < p.classes.size(); ++k) {
        per_class[p.classes[k]] = {{"labelled", s.per_class[k]}, {"correct", s.right_per_class[k]}};
      }
      out["per_class"] = per_class;
    }
  }
  out["texts"] = texts;
  return out;
}

void print_console(const runtime::PredictResult& p, const Inputs& in, const Score& s) {
  if (p.task == runtime::PredictTask::score) {
    Perplexity all;
    for (size_t i = 0; i < p.texts.size(); ++i) {
      const Perplexity one = perplexity(p.texts[i].logprobs);
      all.add(one);
      const std::string ppl = one.value() ? fmt::format("{:.3f}", *one.value()) : "-";
      std::printf("%s\t%lld\t%s\n", ppl.c_str(), static_cast<long long>(one.tokens),
                  one_line(in.texts[i]).c_str());
    }
    std::fprintf(stderr, "dtrain: %zu text(s) in %.2f s (%lld forwards)\n", p.texts.size(),
                 p.seconds, static_cast<long long>(p.forwards));
    if (all.value()) {
      std::fprintf(stderr,
                   "dtrain: perplexity %.4f over %lld scored tokens (mean log-probability "
                   "%.4f)\n",
                   *all.value(), static_cast<long long>(all.tokens),
                   all.logprob / static_cast<double>(all.tokens));
    }
    std::string labels;
    for (const auto& [label, l] : per_label(p, in)) {
      labels += fmt::format("{}{} {} ({} tokens)", labels.empty() ? "" : ", ", label,
                            l.value() ? fmt::format("{:.4f}", *l.value()) : "-", l.tokens);
    }
    if (!labels.empty()) std::fprintf(stderr, "dtrain: perplexity per label: %s\n", labels.c_str());
    return;
  }
  if (p.task == runtime::PredictTask::classify) {
    for (size_t i = 0; i < p.texts.size(); ++i) {
      const runtime::TextPrediction& t = p.texts[i];
      std::printf("%s\t%.4f\t%s\n", p.classes[static_cast<size_t>(t.label)].c_str(),
                  t.probabilities[static_cast<size_t>(t.label)], one_line(in.texts[i]).c_str());
    }
  } else {
    for (size_t i = 0; i < p.texts.size(); ++i) {
      const runtime::TextPrediction& t = p.texts[i];
      std::printf("%s\n", one_line(t.filled).c_str());
      for (size_t m = 0; m < t.masks.size(); ++m) {
        std::string line;
        for (const runtime::TokenScore& c : t.masks[m]) {
          line += fmt::format("{}{} {:.4f}", line.empty() ? "" : ", ",
                              nlohmann::json(c.token).dump(
                                  -1, ' ', false, nlohmann::json::error_handler_t::replace),
                              c.probability);
        }
        std::printf("  [MASK] %zu: %s\n", m + 1, line.c_str());
      }
    }
  }
  int64_t cut = 0;
  for (const runtime::TextPrediction& t : p.texts) cut += t.cut ? 1 : 0;
  if (cut > 0) {
    std::fprintf(stderr,
                 "dtrain: warning: %lld text(s) longer than the model's rows: their first "
                 "model.seq_len - 2 tokens were read\n",
                 static_cast<long long>(cut));
  }
  std::fprintf(stderr, "dtrain: %zu text(s) in %.2f s (%lld forwards)\n", p.texts.size(), p.seconds,
               static_cast<long long>(p.forwards));
  if (s.labelled == 0) return;
  std::string per_class;
  for (size_t k = 0; k < p.classes.size(); ++k) {
    if (s.per_class[k] == 0) continue;
    per_class += fmt::format("{}{} {}/{}", per_class.empty() ? "" : ", ", p.classes[k],
                             s.right_per_class[k], s.per_class[k]);
  }
  std::fprintf(stderr, "dtrain: accuracy %.4f (%lld of %lld labelled texts; per class: %s)\n",
               static_cast<double>(s.correct) / static_cast<double>(s.labelled),
               static_cast<long long>(s.correct), static_cast<long long>(s.labelled),
               per_class.c_str());
}

// --image: files as given, and each directory's image files (by extension), sorted.
std::vector<std::string> image_files(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given) {
    std::error_code ec;
    if (!std::filesystem::is_directory(g, ec)) {
      out.push_back(g);
      continue;
    }
    std::vector<std::string> found;
    int64_t skipped = 0, directories = 0;
    for (const auto& e : std::filesystem::directory_iterator(g, ec)) {
      if (e.is_regular_file(ec) && is_image_file_name(e.path())) {
        found.push_back(e.path().string());
      } else {
        ++skipped;
        directories += e.is_directory(ec) ? 1 : 0;
      }
    }
    if (skipped > 0) {
      std::fprintf(stderr,
                   "dtrain: --image %s: %lld entr%s skipped (not a file named .png, .jpg, "
                   ".jpeg, .pgm, .ppm or .pnm)\n",
                   g.c_str(), static_cast<long long>(skipped), skipped == 1 ? "y" : "ies");
    }
    if (found.empty()) {
      throw Error(fmt::format("--image {}: a directory without a .png, .jpg, .jpeg, .pgm, "
                              ".ppm or .pnm file",
                              g),
                  directories > 0
                      ? "a directory's subdirectories are not searched: pass them (--image "
                        "DIR/*), or --split test for the job's own evaluation split"
                      : "pass image files, or a directory holding some");
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

// At most `top` classes of one image, most likely first: "Coat 0.9120, Shirt 0.0611".
std::string top_classes(const runtime::ImagePredictResult& p, const std::vector<double>& prob,
                        size_t top) {
  std::vector<size_t> order(prob.size());
  std::iota(order.begin(), order.end(), 0);
  top = std::min(top, order.size());
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
      [&](size_t a, size_t b) { return prob[a] != prob[b] ? prob[a] > prob[b] : a < b; });
  std::string s;
  for (size_t j = 0; j < top; ++j)
    s += fmt::format("{}{} {:.4f}", j ? ", " : "", p.classes[order[j]], prob[order[j]]);
  return s;
}

// Files predict could not read (ImagePrediction::error): any makes the exit 2.
int64_t unreadable(const runtime::ImagePredictResult& p) {
  return std::count_if(p.images.begin(), p.images.end(),
                       [](const runtime::ImagePrediction& i) { return !i.error.empty(); });
}

int run_predict_images(const PredictArgs& a, const Job& job) {
  if (!a.texts.empty() || !a.input.empty() || !a.tokenizer.empty() || a.format != "auto") {
    throw Error(fmt::format("model.arch {}: an image model reads images, not --text, --input, "
                            "--format or --tokenizer",
                            job.model.arch),
                "pass --image FILE|DIR (repeatable), or --split test");
  }
  runtime::ImagePredictRequest r;
  r.job = job;
  r.weights = a.checkpoint;
  r.which_weights = a.which_weights;
  r.batch = a.batch;
  r.test_split = a.split == "test";
  r.files = image_files(a.images);
  if (r.files.empty() && !r.test_split)
    throw Error("no images to predict", "pass --image FILE|DIR (repeatable), or --split test");
  if (!r.files.empty() && r.test_split) throw Error("--image and --split test: one or the other");
  const runtime::ImagePredictResult p = runtime::predict_images(r);
  const size_t k = p.classes.size();
  // Per class: the test split's count, those right, and the confusion matrix's row.
  std::vector<int64_t> seen(k, 0), right(k, 0);
  std::vector<std::vector<int64_t>> confusion(k, std::vector<int64_t>(k, 0));
  for (const runtime::ImagePrediction& i : p.images) {
    if (i.truth < 0) continue;
    ++seen[static_cast<size_t>(i.truth)];
    right[static_cast<size_t>(i.truth)] += i.label == i.truth ? 1 : 0;
    ++confusion[static_cast<size_t>(i.truth)][static_cast<size_t>(i.label)];
  }
  if (a.json) {
    nlohmann::json images = nlohmann::json::array();
    for (const runtime::ImagePrediction& i : p.images) {
      if (!i.error.empty()) {  // the file's place, with why it was not read
        images.push_back({{"image", i.where}, {"error", i.error}});
        continue;
      }
      nlohmann::json j = {{"image", i.where},
                          {"label", p.classes[static_cast<size_t>(i.label)]},
                          {"label_id", i.label},
                          {"probabilities", i.probabilities}};
      if (i.truth >= 0) {
        j["expected"] = p.classes[static_cast<size_t>(i.truth)];
        j["expected_id"] = i.truth;
      } else {
        j["width"] = i.width;
        j["height"] = i.height;
        j["channels"] = i.channels;
        j["format"] = i.format;
      }
      images.push_back(j);
    }
    nlohmann::json out = {{"task", "classify-images"},
                          {"weights", p.weights},
                          {"ema", p.ema},
                          {"step", p.step >= 0 ? nlohmann::json(p.step) : nullptr},
                          {"classes", p.classes},
                          {"input", {{"channels", p.channels}, {"size", p.size}}},
                          {"forwards", p.forwards},
                          {"seconds", p.seconds}};
    if (r.test_split) {
      nlohmann::json per_class = nlohmann::json::object();
      for (size_t c = 0; c < k; ++c)
        per_class[p.classes[c]] = {{"labelled", seen[c]}, {"correct", right[c]}};
      out["split"] = "test";
      out["labelled"] = p.images.size();
      out["accuracy"] = p.accuracy;
      out["loss"] = p.loss;
      out["per_class"] = per_class;
      out["confusion"] = confusion;  // rows: the true class, columns: the predicted one
    }
    out["images"] = images;
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return unreadable(p) > 0 ? kExitBadInput : kExitOk;
  }
  const std::string step = weights_label(p.step, p.ema);
  std::fprintf(stderr, "dtrain: classifying %s with %s%s, as %d x %d x %d\n",
               r.test_split ? "the test split" : "images", p.weights.c_str(), step.c_str(),
               p.channels, p.size, p.size);
  if (!r.test_split) {
    for (const runtime::ImagePrediction& i : p.images) {
      if (!i.error.empty()) {
        std::fflush(stdout);        // in file order beside the lines before it
        std::string why = i.error;  // whole, on one line
        std::replace_if(
            why.begin(), why.end(), [](char c) { return c == '\n' || c == '\t' || c == '\r'; },
            ' ');
        std::fprintf(stderr, "dtrain: error: %s\n", why.c_str());
        continue;
      }
      std::printf(
          "%s\t%.4f\t%s\t%s\n", p.classes[static_cast<size_t>(i.label)].c_str(),
          i.probabilities[static_cast<size_t>(i.label)], one_line(i.where).c_str(),
          top_classes(p, i.probabilities, a.top > 0 ? static_cast<size_t>(a.top) : 3).c_str());
    }
  } else {
    // The confusion matrix, a row per true class: what the model mixes up. Past 20
    // classes a row would not fit a screen: each class's count right and the class it
    // is most often taken for instead (--json has the matrix).
    const bool matrix = k <= 20;
    size_t width = 16;
    for (const std::string& c : p.classes)
      width = std::max(width, std::min<size_t>(c.size(), 12) + 4);
    std::printf("%-*s", static_cast<int>(width), matrix ? "true / predicted" : "true");
    if (matrix) {
      for (size_t c = 0; c < k; ++c) std::printf(" %5zu", c);
      std::printf("   right\n");
    } else {
      std::printf("  right      most often taken for\n");
    }
    // A class named by its number is shown once ("3", not "3 3").
    const auto name = [&](size_t c) {
      return p.classes[c] == std::to_string(c)
                 ? p.classes[c]
                 : fmt::format("{} {}", c, one_line(p.classes[c]).substr(0, 12));
    };
    for (size_t t = 0; t < k; ++t) {
      std::printf("%-*s", static_cast<int>(width), name(t).c_str());
      if (matrix) {
        for (size_t c = 0; c < k; ++c)
          std::printf(" %5lld", static_cast<long long>(confusion[t][c]));
        std::printf("   %lld/%lld\n", static_cast<long long>(right[t]),
                    static_cast<long long>(seen[t]));
        continue;
      }
      size_t worst = t;
      for (size_t c = 0; c < k; ++c)
        if (c != t && (worst == t || confusion[t][c] > confusion[t][worst])) worst = c;
      const std::string taken = worst != t && confusion[t][worst] > 0
                                    ? fmt::format("{} ({})", name(worst), confusion[t][worst])
                                    : std::string("-");
      std::printf("  %5lld/%-5lld  %s\n", static_cast<long long>(right[t]),
                  static_cast<long long>(seen[t]), taken.c_str());
    }
  }
  std::fprintf(stderr, "dtrain: %zu image(s) in %.2f s (%lld forwards)\n", p.images.size(),
               p.seconds, static_cast<long long>(p.forwards));
  if (r.test_split) {
    std::fprintf(stderr, "dtrain: test accuracy %.4f, loss %.4f over %zu images\n", p.accuracy,
                 p.loss, p.images.size());
  }
  if (p.classes_source.empty())
    std::fprintf(stderr,
                 "dtrain: warning: the dataset names no classes: they are shown by number\n");
  if (const int64_t bad = unreadable(p); bad > 0) {
    std::fprintf(stderr,
                 "dtrain: %lld of %zu image(s) could not be read (said above); the others are "
                 "classified\n  hint: pass PNG, JPEG, PGM or PPM files, or leave those out\n",
                 static_cast<long long>(bad), p.images.size());
    return kExitBadInput;
  }
  return kExitOk;
}

int run_predict_job(const PredictArgs& a, Job job);

int run_predict(const PredictArgs& a) {
  return run_model_job(a.job, a.overrides, a.device,
                       [&](Job job) { return run_predict_job(a, std::move(job)); });
}

int run_predict_job(const PredictArgs& a, Job job) {
  runtime::PredictRequest r;
  r.job = std::move(job);
  if (runtime::is_image_model(r.job)) return run_predict_images(a, r.job);
  if (!a.images.empty() || !a.split.empty()) {
    throw Error(fmt::format("model.arch {}: --image and --split are for image models (ResNet, "
                            "ViT)",
                            r.job.model.arch),
                "a language model reads texts: --text TEXT or --input FILE");
  }
  runtime::check_predict_model(r.job);
  if (a.format != "auto" && a.input.empty())
    throw Error(
        fmt::format("--format {}: says how --input reads, and there is no --input", a.format));
  const Inputs in = read_inputs(a);
  const std::vector<int32_t> expected = expected_classes(r.job, a.tokenizer, in);
  r.texts = in.texts;
  r.where = in.where;
  r.weights = a.checkpoint;
  r.which_weights = a.which_weights;
  r.tokenizer = a.tokenizer;
  r.top = a.top;
  r.batch = a.batch;
  const runtime::PredictResult p = runtime::predict(r);
  const Score s = score(p, expected);
  if (p.task == runtime::PredictTask::classify && p.classes_file.empty()) {
    std::fprintf(stderr,
                 "dtrain: warning: no labels.json in data.path or beside --tokenizer: the "
                 "classes are shown by number\n");
  }
  if (a.json) {
    std::printf(
        "%s\n",
        to_json(p, in, s).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    const std::string step = weights_label(p.step, p.ema);
    const char* doing = p.task == runtime::PredictTask::classify    ? "classifying"
                        : p.task == runtime::PredictTask::fill_mask ? "filling [MASK]s"
                                                                    : "scoring";
    std::fprintf(stderr, "dtrain: %s with %s%s\n", doing, p.weights.c_str(), step.c_str());
    print_console(p, in, s);
  }
  return kExitOk;
}

}  // namespace

void add_predict(CLI::App& app, Action& action) {
  auto args = std::make_shared<PredictArgs>();
  CLI::App* cmd = app.add_subcommand(
      "predict",
      "classify texts with a BERT classifier, fill a masked-LM BERT's [MASK]s, score texts "
      "with a GPT-2 (log-probabilities, perplexity), or classify images (or the test split) "
      "with a ResNet or ViT");
  cmd->add_option("job", args->job, "job file (YAML) of the model")->required();
  cmd->add_option("--set", args->overrides, "override a key, e.g. --set model.seq_len=256")
      ->allow_extra_args(false);
  cmd->add_option("--text", args->texts, "a text (repeatable); a masked-LM's holds [MASK]s")
      ->allow_extra_args(false);
  cmd->add_option("--input", args->input,
                  "texts from a file: one per line (- for standard input), or labelled rows "
                  "(.jsonl, .tsv, .csv), which also give the classifier's accuracy");
  cmd->add_option("--format", args->format,
                  "how --input reads: lines (one text per line), tsv, jsonl or csv (labelled "
                  "rows); default auto: by the name (.tsv, .jsonl, .csv, .gz after them), else "
                  "lines")
      ->check(CLI::IsMember({"auto", "lines", "tsv", "jsonl", "csv"}));
  cmd->add_option("--image", args->images,
                  "image models: image files (PNG, JPEG, PGM, PPM) or directories of them; "
                  "several after one --image (a shell glob), and repeatable");
  cmd->add_option("--split", args->split,
                  "image models: test classifies the job's test split (data.limit.test "
                  "applies): accuracy, loss, per class and the confusion matrix")
      ->check(CLI::IsMember({"test"}));
  cmd->add_option("--checkpoint", args->checkpoint,
                  "weights: a checkpoint (file or sharded directory), a run or checkpoint "
                  "directory (its newest), best (train.best's), or a .safetensors file (dtrain "
                  "ckpt export); default: the job's newest checkpoint, else model.init_from");
  add_weights_option(cmd, args->which_weights);
  cmd->add_option("--tokenizer", args->tokenizer,
                  "tokenizer.json, or a directory with it (or with GPT-2's vocab.json and "
                  "merges.txt); a labels.json beside it names a classifier's classes "
                  "(default: data.path's)");
  cmd->add_option("--top", args->top,
                  "fill-mask: tokens listed per [MASK] (default 5); images: classes listed per "
                  "image (default 3)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--batch", args->batch,
                  "texts (GPT-2: windows; images) per forward at most (default: 32; for a "
                  "GPT-2 fewer where one forward's logits would pass 1 GiB; for images "
                  "data.micro_batch, which --split test keeps)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N instead of the job's device");
  cmd->add_flag("--json", args->json,
                "print JSON: each text's class and every class's probability, each [MASK]'s "
                "tokens, or each token's log-probability and the perplexity; each image's "
                "class and every class's probability (--split test: also accuracy, loss, "
                "per class and the confusion matrix)");
  cmd->callback([args, &action] { action = [args] { return run_predict(*args); }; });
}

}  // namespace dtrain::cli
