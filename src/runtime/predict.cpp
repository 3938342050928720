// `dtrain predict` (runtime/predict.h): a BERT classifier's classes, or a masked-LM
// BERT's fill-mask, over texts.
#include "runtime/predict.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "data/augment.h"
#include "data/image_file.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/text_loader.h"
#include "data/tokenizer.h"
#include "kernels/memory.h"
#include "models/registry.h"
#include "models/transformer.h"
#include "runtime/data_feed.h"
#include "runtime/inference.h"
#include "runtime/train_state.h"

namespace dtrain::runtime {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMaskText = "[MASK]";

// The special ids the model was trained with: the tokenizer's for token shards (the
// trainer reads them from data.path's tokenizer.json), the top ids of the model's
// vocabulary for synthetic data (the trainer's trained_special layout), whichever
// tokenizer --tokenizer names for the ordinary tokens.
struct Specials {
  TokenId endoftext, cls, sep, pad, mask;
};

Specials trained_specials(const Job& job, const Tokenizer& tok, int64_t vocab) {
  const auto id = [&](Special s) {
    return job.data.dataset == DatasetName::synthetic ? trained_special(vocab, s) : tok.special(s);
  };
  return {id(Special::endoftext), id(Special::cls), id(Special::sep), id(Special::pad),
          id(Special::mask)};
}

// What to do about a row of logits that is not finite (runtime/inference.h softmax_row).
constexpr const char* kLogitsHint = "predict with an earlier checkpoint (--checkpoint)";

// Softmax in double over one row of logits.
std::vector<double> probabilities(const float* logits, int64_t n) {
  const SoftmaxRow row = softmax_row({logits, static_cast<size_t>(n)}, kLogitsHint);
  std::vector<double> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    p[static_cast<size_t>(i)] = std::exp(static_cast<double>(logits[i]) - row.top) / row.sum;
  return p;
}

// log p(target) under one row of logits, in double: the logit less the log of the sum.
double log_probability(const float* logits, int64_t n, TokenId target) {
  const SoftmaxRow row = softmax_row({logits, static_cast<size_t>(n)}, kLogitsHint);
  return static_cast<double>(logits[target]) - row.top - std::log(row.sum);
}

// The most likely class, ties to the smaller id.
int32_t most_likely(const std::vector<double>& p) {
  return static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
}

void classify(const PredictRequest& r, const models::TransformerShape& shape, const Tokenizer& tok,
              const Specials& special, const Tensor& weights, PredictResult& out) {
  const Job& job = r.job;
  const int64_t n = static_cast<int64_t>(r.texts.size()), t_len = shape.seq_len;
  const int64_t classes = *shape.classes;
  const TokenId cls = special.cls, sep = special.sep, pad = special.pad;
  ModelOptions options = job.model;
  options.pad_token_id = pad;  // attention ignores the [PAD]s, as in training
  const int64_t batch = std::min(r.batch > 0 ? r.batch : 32, n);
  out.rows_per_forward = batch;
  const std::unique_ptr<InferenceGraph> f = make_inference_graph(job, options, batch, weights);
  std::vector<TokenId> ids;
  for (int64_t first = 0; first < n; first += batch) {
    int32_t* rows = f->input_host.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      int32_t* row = rows + b * t_len;
      ids.clear();  // a row past the last text stays [CLS] [SEP], never read
      if (first + b < n) tok.encode_append(r.texts[static_cast<size_t>(first + b)], ids);
      const int64_t len = std::min(static_cast<int64_t>(ids.size()), t_len - 2);
      row[0] = cls;
      std::copy_n(ids.begin(), len, row + 1);
      row[len + 1] = sep;
      std::fill(row + len + 2, row + t_len, pad);
      if (first + b < n) {
        TextPrediction& p = out.texts[static_cast<size_t>(first + b)];
        p.tokens = static_cast<int64_t>(ids.size());
        p.cut = p.tokens > t_len - 2;
        p.ids.assign(row, row + len + 2);
      }
    }
    const Tensor logits = kernels::to_host(f->forward());  // [batch, classes]
    ++out.forwards;
    for (int64_t b = 0; b < batch && first + b < n; ++b) {
      TextPrediction& p = out.texts[static_cast<size_t>(first + b)];
      p.probabilities = probabilities(logits.data<float>() + b * classes, classes);
      p.label = most_likely(p.probabilities);
    }
  }
}

// One fill-mask text as ids: <|endoftext|>, the text's tokens with [MASK] where the text
// says "[MASK]", <|endoftext|>. A space before "[MASK]" belongs to the masked word, as
// words carry their leading space in the byte-level BPE (" cat"): the [MASK] takes it
// (RoBERTa's mask token strips it likewise), so "the [MASK] sat" can become "the cat sat".
std::vector<TokenId> fill_mask_ids(const std::string& text, const Tokenizer& tok,
                                   const Specials& special, const std::string& where,
                                   int64_t& masks) {
  std::vector<TokenId> ids = {special.endoftext};
  masks = 0;
  size_t at = 0;
  for (size_t m = text.find(kMaskText); m != std::string::npos; m = text.find(kMaskText, at)) {
    std::string_view before = std::string_view(text).substr(at, m - at);
    if (!before.empty() && before.back() == ' ') before.remove_suffix(1);
    tok.encode_append(before, ids);
    ids.push_back(special.mask);
    ++masks;
    at = m + kMaskText.size();
  }
  tok.encode_append(std::string_view(text).substr(at), ids);
  ids.push_back(special.endoftext);
  if (masks == 0) {
    throw Error(
        fmt::format("{} has no [MASK]: a masked-LM BERT predicts the tokens at [MASK]s", where),
        "write [MASK] (in capitals) where a token is to be predicted, e.g. \"The [MASK] "
        "is blue.\"; a classifier's job (model.num_classes) classifies whole texts");
  }
  return ids;
}

void fill_mask(const PredictRequest& r, const models::TransformerShape& shape, const Tokenizer& tok,
               const Specials& special, const Tensor& weights, PredictResult& out) {
  const Job& job = r.job;
  const int64_t n = static_cast<int64_t>(r.texts.size()), vocab = shape.vocab;
  const TokenId mask = special.mask;
  std::vector<std::vector<TokenId>> ids(static_cast<size_t>(n));
  std::vector<int64_t> masks(static_cast<size_t>(n));
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string where = i < r.where.size() ? r.where[i] : fmt::format("text {}", i + 1);
    ids[i] = fill_mask_ids(r.texts[i], tok, special, where, masks[i]);
    out.texts[i].tokens = static_cast<int64_t>(ids[i].size()) - 2;
    if (static_cast<int64_t>(ids[i].size()) > shape.seq_len) {
      throw Error(fmt::format("{}: {} tokens with the two <|endoftext|> around it, more than the "
                              "model's context (model.seq_len {})",
                              where, ids[i].size(), shape.seq_len),
                  "shorten the text around its [MASK]s (a [MASK] sees the whole text, so "
                  "predict does not cut it as it cuts a classifier's)");
    }
  }
  // Texts of one length share forwards, in input order within a length.
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ids[a].size() < ids[b].size(); });
  const int64_t rows_per_forward = r.batch > 0 ? r.batch : 32;
  out.rows_per_forward = rows_per_forward;
  std::unique_ptr<InferenceGraph> f;
  int64_t predictions = 0;  // f's head rows per text
  for (size_t first = 0; first < order.size();) {
    const size_t length = ids[order[first]].size();
    size_t end = first;
    int64_t most = 0;  // the head's rows per text: the most [MASK]s of these texts
    while (end < order.size() && ids[order[end]].size() == length &&
           static_cast<int64_t>(end - first) < rows_per_forward) {
      most = std::max(most, masks[order[end]]);
      ++end;
    }
    const auto batch = static_cast<int64_t>(end - first);
    const auto t_len = static_cast<int64_t>(length);
    if (!f || f->batch != batch || f->length != t_len || predictions != most) {
      f.reset();  // one executor at a time
      ModelOptions options = job.model;
      options.seq_len = static_cast<int>(t_len);
      options.mlm_predictions = static_cast<int>(most);
      f = make_inference_graph(job, options, batch, weights, /*labels=*/true);
      predictions = most;
    }
    for (int64_t b = 0; b < batch; ++b) {
      const std::vector<TokenId>& s = ids[order[first + static_cast<size_t>(b)]];
      std::copy(s.begin(), s.end(), f->input_host.data<int32_t>() + b * t_len);
      int32_t* labels = f->labels_host.data<int32_t>() + b * t_len;
      for (int64_t p = 0; p < t_len; ++p)
        labels[p] = s[static_cast<size_t>(p)] == mask ? 0 : kIgnoreLabel;  // the head reads these
    }
    const Tensor logits = kernels::to_host(f->forward());  // [batch, most, vocab]
    ++out.forwards;
    for (int64_t b = 0; b < batch; ++b) {
      const size_t i = order[first + static_cast<size_t>(b)];
      TextPrediction& p = out.texts[i];
      p.ids = ids[i];
      std::vector<TokenId> filled = ids[i];
      size_t next_mask = 0;
      for (int64_t m = 0; m < masks[i]; ++m) {
        const std::vector<double> prob =
            probabilities(logits.data<float>() + (b * most + m) * vocab, vocab);
        // The most likely ordinary tokens (bytes and merges; never a special), ties to
        // the smaller id.
        std::vector<int32_t> cand(static_cast<size_t>(tok.first_special()));
        std::iota(cand.begin(), cand.end(), 0);
        const size_t k = std::min(cand.size(), static_cast<size_t>(r.top > 0 ? r.top : 5));
        std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(),
                          [&](int32_t a, int32_t c) {
                            return prob[static_cast<size_t>(a)] != prob[static_cast<size_t>(c)]
                                       ? prob[static_cast<size_t>(a)] > prob[static_cast<size_t>(c)]
                                       : a < c;
                          });
        std::vector<TokenScore> top;
        for (size_t j = 0; j < k; ++j)
          top.push_back({cand[j], tok.piece(cand[j]), prob[static_cast<size_t>(cand[j])]});
        while (filled[next_mask] != mask) ++next_mask;
        filled[next_mask] = top.front().id;
        p.masks.push_back(std::move(top));
      }
      p.filled = tok.decode(std::vector<TokenId>(filled.begin() + 1, filled.end() - 1));
    }
    first = end;
  }
}

// ---- GPT-2: scores -------------------------------------------------------------------

// One window of one text: ids[begin, end) run, and the tokens at [first, end] scored
// (token t by the logits at position t - 1: the window's last position predicts ids[end]).
struct Window {
  size_t text;
  int64_t begin, end, first;
};

void score(const PredictRequest& r, const models::TransformerShape& shape, const Tokenizer& tok,
           const Tensor& weights, PredictResult& out) {
  const Job& job = r.job;
  const int64_t context = shape.seq_len, vocab = shape.vocab;
  const int64_t stride = std::max<int64_t>(1, context / 2);
  // Windows per forward: --batch, else as many as keep the logits within 1 GiB.
  const int64_t rows_per_forward =
      r.batch > 0 ? r.batch : std::clamp<int64_t>((int64_t{1} << 28) / (context * vocab), 1, 32);
  out.rows_per_forward = rows_per_forward;
  const TokenId end_id = tok.special(Special::endoftext);
  std::vector<std::vector<TokenId>> ids(r.texts.size());
  std::vector<Window> windows;
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = {end_id};
    tok.encode_append(r.texts[i], ids[i]);
    const auto n = static_cast<int64_t>(ids[i].size());
    out.texts[i].tokens = n - 1;
    out.texts[i].logprobs.assign(static_cast<size_t>(n - 1), 0.0);  // windows fill them
    // Each window runs up to `context` tokens and scores the ones after them that the
    // previous window did not: a text of up to `context` tokens after <|endoftext|> is one
    // window, every token seeing all before it, as the trainer's evaluation sees them.
    for (int64_t begin = 0, first = 1; first < n; begin += stride) {
      const int64_t end = std::min(begin + context, n - 1);
      windows.push_back({i, begin, end, first});
      first = end + 1;
    }
  }
  // Windows of one graph length share forwards; texts keep their order within a length.
  std::stable_sort(windows.begin(), windows.end(), [&](const Window& a, const Window& b) {
    return padded_length(a.end - a.begin, context) < padded_length(b.end - b.begin, context);
  });
  std::unique_ptr<InferenceGraph> f;
  for (size_t first = 0; first < windows.size();) {
    const int64_t length = padded_length(windows[first].end - windows[first].begin, context);
    size_t last = first;
    while (last < windows.size() &&
           padded_length(windows[last].end - windows[last].begin, context) == length &&
           static_cast<int64_t>(last - first) < rows_per_forward)
      ++last;
    const auto batch = static_cast<int64_t>(last - first);
    if (!f || f->batch != batch || f->length != length) {
      f.reset();  // one executor at a time
      ModelOptions options = job.model;
      options.seq_len = static_cast<int>(length);
      f = make_inference_graph(job, options, batch, weights);
    }
    int32_t* rows = f->input_host.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      const Window& w = windows[first + static_cast<size_t>(b)];
      const std::vector<TokenId>& s = ids[w.text];
      std::copy(s.begin() + w.begin, s.begin() + w.end, rows + b * length);
      std::fill(rows + b * length + (w.end - w.begin), rows + (b + 1) * length, end_id);
    }
    const Tensor& logits = f->forward();  // [batch, length, vocab]
    ++out.forwards;
    for (int64_t b = 0; b < batch; ++b) {
      const Window& w = windows[first + static_cast<size_t>(b)];
      TextPrediction& p = out.texts[w.text];
      ++p.windows;
      const int64_t row0 = b * length + (w.first - 1 - w.begin);  // predicts token w.first
      const Tensor rows_host = kernels::to_host(
          logits.view(row0 * vocab, {(w.end + 1 - w.first) * vocab}));  // the rows it needs
      for (int64_t t = w.first; t <= w.end; ++t) {
        const TokenId target = ids[w.text][static_cast<size_t>(t)];
        p.logprobs[static_cast<size_t>(t - 1)] =
            log_probability(rows_host.data<float>() + (t - w.first) * vocab, vocab, target);
      }
    }
    first = last;
  }
  for (size_t i = 0; i < ids.size(); ++i) out.texts[i].ids = std::move(ids[i]);
}

}  // namespace

std::vector<std::string> class_names(const Job& job, const std::string& tokenizer,
                                     std::string* found) {
  const int classes = job.model.num_classes.value_or(0);
  std::vector<fs::path> places;
  if (job.data.path && job.data.dataset == DatasetName::tokens) places.emplace_back(*job.data.path);
  if (!tokenizer.empty()) {
    std::error_code ec;
    places.push_back(fs::is_directory(tokenizer, ec) ? fs::path(tokenizer)
                                                     : fs::path(tokenizer).parent_path());
  }
  for (const fs::path& dir : places) {
    const fs::path file = dir / "labels.json";
    std::error_code ec;
    if (fs::exists(file, ec)) {
      std::vector<std::string> names = read_class_names(file);
      if (static_cast<int>(names.size()) != classes) {
        throw Error(fmt::format("{} names {} classes, the job's model.num_classes is {}",
                                file.string(), names.size(), classes),
                    fmt::format("set model.num_classes: {}, as the run that trained the model "
                                "did",
                                names.size()));
      }
      if (found != nullptr) *found = file.string();
      return names;
    }
  }
  std::vector<std::string> names;
  for (int k = 0; k < classes; ++k) names.push_back(std::to_string(k));
  return names;
}

void check_predict_model(const Job& job) {
  const ArchPreset* arch = find_arch(job.model.arch);
  if (arch == nullptr || !is_language_model(arch->family)) {
    throw Error(fmt::format("model.arch {}: texts are read by a BERT (a classifier, or a "
                            "masked-LM filling [MASK]s) or a GPT-2 (scores)",
                            job.model.arch),
                is_image_model(job) ? "an image model reads images: --image FILE|DIR, or "
                                      "--split test"
                                    : "check model.arch");
  }
}

bool is_image_model(const Job& job) {
  const ArchPreset* arch = find_arch(job.model.arch);
  return arch != nullptr && !is_language_model(arch->family);
}

std::vector<std::string> image_class_names(const Job& job, const std::vector<std::string>& trained,
                                           std::string* source) {
  const int classes = job.model.num_classes.value_or(0);
  if (static_cast<int>(trained.size()) == classes) {
    if (source != nullptr) *source = "the weights' run";
    return trained;
  }
  std::vector<std::string> names;
  std::string from;
  const auto names_file = [&](const char* file) {
    if (!job.data.path) return;
    const fs::path p = fs::path(*job.data.path) / file;
    std::ifstream in(p);
    std::vector<std::string> read;
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
        line.pop_back();
      if (!line.empty()) read.push_back(line);
    }
    if (static_cast<int>(read.size()) == classes) {
      names = std::move(read);
      from = p.string();
    }
  };
  switch (job.data.dataset) {
    case DatasetName::fashion_mnist:
      names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
      from = "Fashion-MNIST";
      break;
    case DatasetName::mnist:
      names = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
      from = "MNIST";
      break;
    case DatasetName::cifar10:
      names_file("batches.meta.txt");
      if (names.empty()) {
        names = {"airplane", "automobile", "bird",  "cat",  "deer",
                 "dog",      "frog",       "horse", "ship", "truck"};
        from = "CIFAR-10";
      }
      break;
    case DatasetName::cifar100:
      names_file("fine_label_names.txt");
      break;
    case DatasetName::image_folder:  // weights older than their record: the folder's now
      if (job.data.path) {
        try {
          names = image_folder_classes(*job.data.path);
          from = image_folder_split_dir(*job.data.path, Split::train).string();
        } catch (const Error&) {
          names.clear();
        }
      }
      break;
    default:
      break;
  }
  if (static_cast<int>(names.size()) != classes) {
    names.clear();
    from.clear();
    for (int k = 0; k < classes; ++k) names.push_back(std::to_string(k));
  }
  if (source != nullptr) *source = from;
  return names;
}

ImagePredictResult predict_images(const ImagePredictRequest& r) {
  const Job& job = r.job;
  if (!is_image_model(job)) {
    throw Error(fmt::format("model.arch {}: --image and --split read images, for a ResNet or "
                            "a ViT",
                            job.model.arch),
                "a language model reads texts: --text TEXT or --input FILE");
  }
  if (r.files.empty() != r.test_split)
    throw Error("predict: give image files (--image) or --split test, one of the two");
  if (r.batch < 0) throw Error(fmt::format("--batch {}: at least 0 (auto)", r.batch));
  ImagePredictResult out;
  int64_t batch = r.batch > 0 ? r.batch : job.data.micro_batch;
  if (!r.test_split) batch = std::min(batch, static_cast<int64_t>(r.files.size()));
  out.rows_per_forward = batch;
  const ModelWeights w = read_model_weights(job, r.weights, models::build_model(job.model, 1).graph,
                                            0, "predict", r.which_weights);
  out.weights = w.source;
  out.ema = w.ema;
  out.step = w.step;
  out.classes = image_class_names(job, w.classes, &out.classes_source);
  const auto classes = static_cast<int64_t>(out.classes.size());
  const std::unique_ptr<InferenceGraph> f =
      make_inference_graph(job, job.model, batch, w.params, false, w.buffers);
  const Shape& in = f->input_host.shape();  // [batch, C, H, W]
  DTRAIN_CHECK(in.rank() == 4, "an image model's input is {}", in.str());
  const ImageGeometry g{static_cast<int>(in[1]), static_cast<int>(in[2]), static_cast<int>(in[3]),
                        static_cast<int>(classes)};
  out.channels = g.channels;
  out.size = g.height;
  double seconds = 0.0;
  // One forward over the rows filled in input_host: each row's class probabilities.
  const auto run = [&](int64_t rows,
                       const std::function<void(int64_t, std::vector<double>)>& take) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = kernels::to_host(f->forward());  // [batch, classes]
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++out.forwards;
    DTRAIN_CHECK(logits.numel() == batch * classes, "logits {} for {} x {}", logits.str(), batch,
                 classes);
    for (int64_t b = 0; b < rows; ++b)
      take(b, probabilities(logits.data<float>() + b * classes, classes));
  };
  if (r.test_split) {
    // The evaluation's own feed: its batches of data.micro_batch, the last one padded
    // (labels -100), normalised as the trainer's evaluation sees them.
    if (batch != job.data.micro_batch)
      throw Error(fmt::format("--batch {} with --split test: the test split comes in batches of "
                              "data.micro_batch ({})",
                              batch, job.data.micro_batch),
                  fmt::format("leave --batch out, or --set data.micro_batch={}", batch));
    // An unreadable image is an Error naming it here: data.unreadable: skip is training's
    // (a left-out sample would end the batch's rows, read up to the first ignore label).
    Job reading = job;
    reading.data.unreadable = UnreadableAction::stop;
    const std::unique_ptr<DataSource> source = DataSource::open(reading, job.run.seed);
    if (const std::string mismatch = class_mismatch(w.classes, source->class_names());
        !mismatch.empty()) {
      throw Error(fmt::format("--split test: {}: {}, so its labels would not be theirs", w.source,
                              mismatch),
                  "restore the class directories the run trained on (labels are their "
                  "positions in byte order)");
    }
    const std::unique_ptr<DataFeed> feed = source->feed(FeedSplit::eval, {}, FeedContent::all);
    double loss = 0.0;
    int64_t right = 0;
    for (int64_t k = 0; k < feed->batches_per_epoch(); ++k) {
      const FeedBatch& b = feed->next();
      kernels::copy(kernels::to_host(b.input), f->input_host);
      const Tensor labels = kernels::to_host(b.labels);
      int64_t rows = 0;
      while (rows < batch && labels.data<int32_t>()[rows] != kIgnoreLabel) ++rows;
      run(rows, [&](int64_t row, std::vector<double> p) {
        ImagePrediction pr;
        // The split in its order (one process, unshuffled): sample i is image i.
        const auto i = static_cast<int64_t>(out.images.size());
        pr.where = source->eval_sample_name(i);
        if (pr.where.empty()) pr.where = fmt::format("test {}", i);
        pr.truth = labels.data<int32_t>()[row];
        pr.label = most_likely(p);
        loss -= std::log(p[static_cast<size_t>(pr.truth)]);
        right += pr.label == pr.truth ? 1 : 0;
        pr.probabilities = std::move(p);
        out.images.push_back(std::move(pr));
      });
    }
    const auto n = static_cast<double>(std::max<size_t>(1, out.images.size()));
    out.loss = loss / n;
    out.accuracy = static_cast<double>(right) / n;
  } else {
    // Files: decoded, made the model's size and channels, normalised as the dataset is.
    AugmentConfig cfg;
    cfg.stats = input_normalization(job.data.dataset, g.channels);
    const Augmenter normalise(g, cfg);
    // Rows are filled with readable images only; an unreadable file keeps its place in
    // the output with its error.
    out.images.resize(r.files.size());
    std::vector<size_t> rows;  // the images in input_host, by row
    const auto flush = [&] {
      if (rows.empty()) return;
      run(static_cast<int64_t>(rows.size()), [&](int64_t row, std::vector<double> p) {
        ImagePrediction& pr = out.images[rows[static_cast<size_t>(row)]];
        pr.label = most_likely(p);
        pr.probabilities = std::move(p);
      });
      rows.clear();
    };
    for (size_t i = 0; i < r.files.size(); ++i) {
      ImagePrediction& pr = out.images[i];
      pr.where = r.files[i];
      try {
        const DecodedImage img = read_image_file(r.files[i]);
        const std::vector<float> x = to_model_input(img, g, job.data.center_crop.value_or(1.0));
        normalise.apply(
            x.data(), f->input_host.data<float>() + static_cast<int64_t>(rows.size()) * g.pixels(),
            0, 0);
        pr.width = img.width;
        pr.height = img.height;
        pr.channels = img.channels;
        pr.format = img.format;
      } catch (const RunError&) {
        throw;
      } catch (const Error& e) {
        pr.error = e.message();
        continue;
      }
      rows.push_back(i);
      if (static_cast<int64_t>(rows.size()) == batch) flush();
    }
    flush();
  }
  out.seconds = seconds;
  return out;
}

PredictResult predict(const PredictRequest& r) {
  const Job& job = r.job;
  check_predict_model(job);
  if (r.texts.empty())
    throw Error("no texts to predict", "pass --text TEXT (repeatable) or --input FILE");
  if (r.batch < 0 || r.top < 0)
    throw Error(fmt::format("--batch {} and --top {}: at least 0 (auto)", r.batch, r.top));
  const bool gpt = find_arch(job.model.arch)->family == ModelFamily::gpt;
  const models::TransformerShape shape =
      models::resolve_transformer(job.model, gpt ? ModelFamily::gpt : ModelFamily::bert);
  const Tokenizer tok = read_model_tokenizer(job, r.tokenizer, "predict");
  // The rows the texts need: every token for a BERT (its specials take the top ids); the
  // ordinary tokens and <|endoftext|> for a GPT-2 (Hugging Face's has 50257 rows, and
  // dtrain appends its five other specials after them).
  const int64_t needed =
      gpt ? std::max<int64_t>(tok.first_special(), tok.special(Special::endoftext) + 1)
          : tok.vocab_size();
  if (needed > shape.vocab) {
    throw Error(fmt::format("the tokenizer's tokens need {} rows, more than the model's "
                            "vocabulary ({})",
                            needed, shape.vocab),
                "use the tokenizer of the model's training data (data.path or --tokenizer)");
  }
  PredictResult out;
  out.task = gpt                         ? PredictTask::score
             : shape.classes.has_value() ? PredictTask::classify
                                         : PredictTask::fill_mask;
  if (r.top > 0 && out.task != PredictTask::fill_mask) {
    throw Error(fmt::format("--top {}: lists the most likely tokens of a masked-LM's [MASK]s, "
                            "and this job's model {}",
                            r.top,
                            out.task == PredictTask::score ? "is a GPT-2 (it scores texts)"
                                                           : "is a classifier (every class's "
                                                             "probability is printed)"),
                "leave --top out");
  }
  if (out.task == PredictTask::classify)
    out.classes = class_names(job, r.tokenizer, &out.classes_file);
  const Specials special = trained_specials(job, tok, shape.vocab);
  out.mask_id = special.mask;
  const ModelWeights w = [&] {
    ModelOptions options = job.model;  // the layout alone: no executor, nothing allocated
    options.seq_len = static_cast<int>(std::min<int64_t>(shape.seq_len, kShortestForward));
    options.mlm_predictions = 1;
    return read_model_weights(job, r.weights, models::build_model(options, 1).graph, shape.heads,
                              "predict", r.which_weights);
  }();
  out.weights = w.source;
  out.ema = w.ema;
  out.step = w.step;
  out.texts.resize(r.texts.size());
  const auto start = std::chrono::steady_clock::now();
  try {
    switch (out.task) {
      case PredictTask::classify:
        classify(r, shape, tok, special, w.params, out);
        break;
      case PredictTask::fill_mask:
        fill_mask(r, shape, tok, special, w.params, out);
        break;
      case PredictTask::score:
        score(r, shape, tok, w.params, out);
        break;
    }
  } catch (const Error& e) {
    const std::string m = e.message();
    if (m.rfind("out of host memory", 0) != 0 && m.rfind("out of memory on", 0) != 0) throw;
    const int64_t ran = out.rows_per_forward;
    throw RunError(m, fmt::format("predict fewer {} at once: --batch {} (this run: {} per "
                                  "forward)",
                                  out.task == PredictTask::score ? "windows" : "texts",
                                  std::max<int64_t>(1, ran / 2), ran));
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace dtrain::runtime
