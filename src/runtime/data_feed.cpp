// The two data sources behind DataFeed: images through the prefetching Loader
// (the test split padded, padding labels set to -100), and token windows through
// TextBatches (masked LM for BERT, causal LM for GPT) over tokenized shards or
// over synthetic tokens drawn from the seed.
#include "runtime/data_feed.h"

#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/rng_streams.h"
#include "data/text_loader.h"

namespace dtrain::runtime {

namespace {

// Which splits a data.limit key cut short: the errors about a split too small name it.
struct Cut {
  bool train = false, test = false;
};
std::string cut_key(FeedSplit split) {
  return split == FeedSplit::eval ? "data.limit.test" : "data.limit.train";
}

// ---- images ----------------------------------------------------------------

class ImageFeed final : public DataFeed {
 public:
  ImageFeed(std::shared_ptr<const Dataset> set, const LoaderConfig& cfg, bool eval)
      : loader_(set, cfg), size_(set->size()), source_(set->source()), eval_(eval) {}

  const FeedBatch& next() override {
    const Batch& b = loader_.next();
    if (!labels_.defined()) labels_ = Tensor::empty(b.labels.shape(), DType::i32);
    std::memcpy(labels_.raw(), b.labels.raw(), b.labels.nbytes());
    if (eval_) {  // wrap-around padding counts for nothing (cross-entropy's ignore index)
      for (int64_t i = b.valid; i < labels_.numel(); ++i) labels_.data<int32_t>()[i] = -100;
    }
    batch_ = {b.images, labels_, b.next, b.epoch, count_labelled(labels_), {}};
    batch_.unreadable = b.unreadable;
    return batch_;
  }
  int64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  double wait_seconds() const override { return loader_.wait_seconds(); }
  std::string describe() const override { return fmt::format("{} images in {}", size_, source_); }

 private:
  Loader loader_;
  int64_t size_;
  std::string source_;
  bool eval_;
  Tensor labels_;
  FeedBatch batch_;
};

class ImageSource final : public DataSource {
 public:
  ImageSource(const Job& job, uint64_t seed, DataShard shard)
      : job_(job), seed_(seed), shard_(shard) {
    SyntheticSpec synth;
    synth.geometry = {job.model.in_channels.value_or(3), job.model.image_size.value_or(32),
                      job.model.image_size.value_or(32), job.model.num_classes.value_or(10)};
    synth.seed = seed;
    train_ = open_dataset(job.data, Split::train, synth);
    test_ = open_dataset(job.data, Split::test, synth);
    const auto whole_train = train_, whole_test = test_;
    if (job.data.limit.train) train_ = first_samples(train_, *job.data.limit.train);
    if (job.data.limit.test) test_ = first_samples(test_, *job.data.limit.test);
    cut_ = {train_ != whole_train, test_ != whole_test};
  }
  std::unique_ptr<DataFeed> feed(FeedSplit split, DataPosition start,
                                 FeedContent content) const override {
    const bool eval = split == FeedSplit::eval;
    LoaderConfig cfg = make_loader_config(job_.data, eval ? Split::test : Split::train, seed_,
                                          shard_.rank, shard_.world, eval ? DataPosition{} : start,
                                          train_->geometry().channels);
    if (eval ? cut_.test : cut_.train) cfg.sampler.cut_by = cut_key(split);
    if (!eval) cfg.sampler.micro_steps = job_.parallel.micro_batches;
    cfg.read_images = content == FeedContent::all;
    return std::make_unique<ImageFeed>(eval ? test_ : train_, cfg, eval);
  }
  std::string describe() const override {
    return fmt::format("{} train images ({}), {} test images ({})", train_->size(),
                       train_->source(), test_->size(), test_->source());
  }
  std::vector<std::string> class_names() const override { return train_->class_names(); }
  std::string eval_sample_name(int64_t i) const override { return test_->sample_name(i); }

 private:
  Cut cut_;
  const Job& job_;
  uint64_t seed_;
  DataShard shard_;
  std::shared_ptr<const Dataset> train_, test_;
};

// ---- tokens ----------------------------------------------------------------

// data.path of a tokens job, checked against the model's vocabulary.
TextData open_token_dir(const Job& job, int64_t vocab) {
  if (!job.data.path) {
    throw Error("data.path: the tokens dataset needs the directory `dtrain data tokenize` wrote",
                "run `dtrain data tokenize --input TEXT... --vocab-size N --out DIR`, then set "
                "data.path: DIR");
  }
  const std::string& dir = *job.data.path;
  if (!std::filesystem::is_directory(dir)) {
    // The command that writes it for this job: its vocabulary, and a class per input for
    // a classifier.
    const std::string inputs = job.model.num_classes
                                   ? "--labelled --input CLASS_A --input CLASS_B ..."
                                   : "--input TEXT...";
    throw Error(fmt::format("data.path: {} is not a directory", dir),
                fmt::format("tokenize a corpus into it first: `dtrain data tokenize {} "
                            "--vocab-size {} --out {}` (the token shards' directory, not a file "
                            "in it)",
                            inputs, vocab, dir));
  }
  TextData data = open_text_data(dir);
  if (data.tokenizer->vocab_size() > vocab) {
    throw Error(fmt::format("model.vocab_size: {} is smaller than the {} tokens of {}/"
                            "tokenizer.json",
                            vocab, data.tokenizer->vocab_size(), dir),
                fmt::format("set model.vocab_size: {}", data.tokenizer->vocab_size()));
  }
  return data;
}

class TextFeed final : public DataFeed {
 public:
  TextFeed(std::shared_ptr<const TokenShard> shard, const TextBatchConfig& cfg,
           DataPosition start = {})
      : batches_(shard, cfg, start), shard_(std::move(shard)) {}

  const FeedBatch& next() override {
    const TokenBatch b = batches_.next();
    batch_ = {b.input, b.labels, b.info.next, b.info.epoch, count_labelled(b.labels), {}};
    return batch_;
  }
  int64_t batches_per_epoch() const override { return batches_.batches_per_epoch(); }
  double wait_seconds() const override { return 0.0; }  // windows are cut on the caller's thread
  std::string describe() const override {
    return fmt::format("{} windows of {} tokens in {}", batches_.windows(), shard_->tokens.size(),
                       shard_->path);
  }

 private:
  TextBatches batches_;
  std::shared_ptr<const TokenShard> shard_;
  FeedBatch batch_;
};

// Uniform ids in [0, vocab - 1): the top id plays [MASK] for masked-LM batches.
std::shared_ptr<const TokenShard> synthetic_tokens(int64_t vocab, int64_t count, uint64_t seed,
                                                   uint32_t split) {
  auto shard = std::make_shared<TokenShard>();
  shard->path = fmt::format("<synthetic {} tokens>", split == 0 ? "train" : "test");
  shard->vocab_size = vocab;
  shard->tokens.resize(static_cast<size_t>(count));
  const Philox rng(seed, rng_stream_id(data_rng::kSynthetic, 2 + split, 0));
  for (int64_t i = 0; i < count; ++i) {
    shard->tokens[static_cast<size_t>(i)] =
        static_cast<TokenId>(rng.u32(static_cast<uint64_t>(i)) % static_cast<uint32_t>(vocab - 1));
  }
  return shard;
}

// The first `windows` windows of a shard (data.limit.<key>), as a copy whose name
// says so: errors about the cut count its tokens, not the file's.
std::shared_ptr<const TokenShard> first_windows(std::shared_ptr<const TokenShard> s,
                                                std::optional<int64_t> windows, int64_t seq_len,
                                                const char* key) {
  if (!windows) return s;
  const size_t keep = static_cast<size_t>(*windows * seq_len + 1);
  if (keep >= s->tokens.size()) return s;
  auto cut = std::make_shared<TokenShard>(*s);
  cut->tokens.resize(keep);
  cut->path = fmt::format("{} cut to {} windows by data.limit.{}", s->path, *windows, key);
  return cut;
}

class TextSource final : public DataSource {
 public:
  TextSource(const Job& job, uint64_t seed, DataShard shard)
      : job_(job), seed_(seed), shard_(shard) {
    const ModelOptions& m = job.model;
    const int64_t vocab = m.vocab_size.value_or(0), seq = m.seq_len.value_or(0);
    const ArchPreset* arch = find_arch(m.arch);
    task_ = arch && arch->family == ModelFamily::bert ? LmTask::masked : LmTask::causal;
    if (job.data.dataset == DatasetName::synthetic) {
      train_ = synthetic_tokens(vocab, 10000 * (seq + 1), seed, 0);
      val_ = synthetic_tokens(vocab, 100 * (seq + 1), seed, 1);
      masking_ = {predictions(), static_cast<TokenId>(vocab - 1), static_cast<TokenId>(vocab - 1)};
    } else {
      open_shards(vocab);
    }
    const auto whole_train = train_, whole_val = val_;
    train_ = first_windows(train_, job.data.limit.train, seq, "train");
    val_ = first_windows(val_, job.data.limit.test, seq, "test");
    cut_ = {train_ != whole_train, val_ != whole_val};
    // Every run ends with an evaluation: a validation split without one window is refused
    // now (counting its windows), not after the training.
    feed(FeedSplit::eval, {}, FeedContent::all);
  }

  std::unique_ptr<DataFeed> feed(FeedSplit split, DataPosition start,
                                 FeedContent /*tokens: always read*/) const override {
    TextBatchConfig cfg;
    cfg.task = task_;
    cfg.seq_len = job_.model.seq_len.value_or(0);
    cfg.batch = job_.data.micro_batch;
    cfg.rank = shard_.rank;
    cfg.world = shard_.world;
    if (split == FeedSplit::train) cfg.micro_steps = job_.parallel.micro_batches;
    cfg.seed = seed_;
    cfg.masking = masking_;
    if (split == FeedSplit::eval ? cut_.test : cut_.train) cfg.cut_by = cut_key(split);
    if (split == FeedSplit::eval) {
      cfg.order = TextOrder::sequential;
      return std::make_unique<TextFeed>(val_, cfg);
    }
    return std::make_unique<TextFeed>(train_, cfg, start);
  }
  std::string describe() const override {
    return fmt::format("{} train tokens ({}), {} validation tokens ({})", train_->tokens.size(),
                       train_->path, val_->tokens.size(), val_->path);
  }

 private:
  Cut cut_;
  void open_shards(int64_t vocab) {
    const TextData data = open_token_dir(job_, vocab);
    masking_ = {predictions(), data.tokenizer->special(Special::mask),
                data.tokenizer->first_special()};
    train_ = data.train;
    val_ = data.val;
  }

  // Positions masked per window: the count the model's head was built for.
  int64_t predictions() const {
    const ModelOptions& m = job_.model;
    return m.mlm_predictions.value_or(
        static_cast<int>(masked_lm_predictions(m.seq_len.value_or(1), job_.data.mlm_probability)));
  }

  const Job& job_;
  uint64_t seed_;
  DataShard shard_;
  LmTask task_ = LmTask::causal;
  MaskingConfig masking_;
  std::shared_ptr<const TokenShard> train_, val_;
};

// ---- labelled texts (BERT classification) ----------------------------------

class ClassifyFeed final : public DataFeed {
 public:
  ClassifyFeed(LabelledText data, const ClassifyConfig& cfg, DataPosition start = {})
      : batches_(std::move(data), cfg, start),
        input_(Tensor::empty({cfg.batch, cfg.seq_len}, DType::i32)),
        labels_(Tensor::empty({cfg.batch}, DType::i32)) {}

  const FeedBatch& next() override {
    const BatchInfo info = batches_.next(input_.data<int32_t>(), labels_.data<int32_t>());
    batch_ = {input_, labels_, info.next, info.epoch, count_labelled(labels_), {}};
    return batch_;
  }
  int64_t batches_per_epoch() const override { return batches_.batches_per_epoch(); }
  double wait_seconds() const override { return 0.0; }
  std::string describe() const override {
    return fmt::format("{} texts in {}", batches_.texts(), batches_.path());
  }

 private:
  ClassifyBatches batches_;
  Tensor input_, labels_;
  FeedBatch batch_;
};

// Synthetic labelled texts in the layout of a trained vocabulary of `vocab` ids (the
// specials on top, trained_special): `count` texts of 1 to seq_len ordinary ids, each
// with a uniform class.
LabelledText synthetic_texts(int64_t vocab, int64_t seq_len, int64_t classes, int64_t count,
                             uint64_t seed, uint32_t split) {
  auto tokens = std::make_shared<TokenShard>();
  auto labels = std::make_shared<TokenShard>();
  const char* name = split == 0 ? "train" : "test";
  tokens->path = fmt::format("<synthetic {} texts>", name);
  labels->path = fmt::format("<synthetic {} labels>", name);
  tokens->vocab_size = vocab;
  labels->vocab_size = classes;
  const auto ordinary = static_cast<uint32_t>(vocab - kNumSpecials);
  // Stream (synthetic, 4 + split, 0): words 2k and 2k + 1 draw text k's class and length;
  // stream (synthetic, 6 + split, k) its ids.
  const Philox meta(seed, rng_stream_id(data_rng::kSynthetic, 4 + split, 0));
  for (int64_t k = 0; k < count; ++k) {
    const auto u = static_cast<uint64_t>(k);
    labels->tokens.push_back(
        static_cast<TokenId>(meta.u32(2 * u) % static_cast<uint32_t>(classes)));
    const int64_t len =
        1 + static_cast<int64_t>(meta.u32(2 * u + 1) % static_cast<uint32_t>(seq_len));
    const Philox text(seed, rng_stream_id(data_rng::kSynthetic, 6 + split, u));
    tokens->tokens.push_back(trained_special(vocab, Special::endoftext));
    for (int64_t i = 0; i < len; ++i)
      tokens->tokens.push_back(static_cast<TokenId>(text.u32(static_cast<uint64_t>(i)) % ordinary));
  }
  return {tokens, labels};
}

class ClassifySource final : public DataSource {
 public:
  ClassifySource(const Job& job, uint64_t seed, DataShard shard)
      : job_(job), seed_(seed), shard_(shard) {
    const ModelOptions& m = job.model;
    const int64_t vocab = m.vocab_size.value_or(0), seq = m.seq_len.value_or(0);
    const int64_t classes = *m.num_classes;
    if (job.data.dataset == DatasetName::synthetic) {
      if (vocab <= kNumSpecials) {
        throw Error(fmt::format("model.vocab_size: {} leaves no ordinary token after the {} "
                                "specials",
                                vocab, kNumSpecials),
                    "set a larger model.vocab_size");
      }
      train_ = synthetic_texts(vocab, seq - 2, classes, 4096, seed, 0);
      val_ = synthetic_texts(vocab, seq - 2, classes, 256, seed, 1);
      ids_ = {trained_special(vocab, Special::endoftext), trained_special(vocab, Special::cls),
              trained_special(vocab, Special::sep), trained_special(vocab, Special::pad)};
    } else {
      const TextData data = open_token_dir(job, vocab);
      const std::string& dir = *job.data.path;
      if (data.classes.empty()) {
        throw Error(fmt::format("data.path: {} holds token shards without labels, but "
                                "model.num_classes: {} asks for a classifier",
                                dir, classes),
                    "tokenize labelled texts with `dtrain data tokenize --labelled --input "
                    "CLASS_A --input CLASS_B ...`, or remove model.num_classes to pretrain "
                    "with the masked-LM objective");
      }
      if (static_cast<int64_t>(data.classes.size()) != classes) {
        throw Error(fmt::format("model.num_classes: {}, but {}/labels.json names {} classes",
                                classes, dir, data.classes.size()),
                    fmt::format("set model.num_classes: {}", data.classes.size()));
      }
      train_ = {data.train, data.train_labels};
      val_ = {data.val, data.val_labels};
      const Tokenizer& tok = *data.tokenizer;
      ids_ = {tok.special(Special::endoftext), tok.special(Special::cls), tok.special(Special::sep),
              tok.special(Special::pad)};
    }
    const LabelledText whole_train = train_, whole_val = val_;
    train_ = first_texts(train_, job.data.limit.train, "train");
    val_ = first_texts(val_, job.data.limit.test, "test");
    cut_ = {train_.tokens != whole_train.tokens, val_.tokens != whole_val.tokens};
    feed(FeedSplit::eval, {},
         FeedContent::all);  // a validation split without one text is refused now
  }

  std::unique_ptr<DataFeed> feed(FeedSplit split, DataPosition start,
                                 FeedContent /*tokens: always read*/) const override {
    ClassifyConfig cfg;
    cfg.seq_len = job_.model.seq_len.value_or(0);
    cfg.batch = job_.data.micro_batch;
    cfg.rank = shard_.rank;
    cfg.world = shard_.world;
    if (split == FeedSplit::train) cfg.micro_steps = job_.parallel.micro_batches;
    cfg.seed = seed_;
    cfg.separator = ids_.separator;
    cfg.cls = ids_.cls;
    cfg.sep = ids_.sep;
    cfg.pad = ids_.pad;
    if (split == FeedSplit::eval ? cut_.test : cut_.train) cfg.cut_by = cut_key(split);
    if (split == FeedSplit::eval) {
      cfg.order = TextOrder::sequential;
      return std::make_unique<ClassifyFeed>(val_, cfg);
    }
    return std::make_unique<ClassifyFeed>(train_, cfg, start);
  }
  std::string describe() const override {
    return fmt::format("{} train texts ({}), {} validation texts ({}), {} classes",
                       train_.labels->tokens.size(), train_.tokens->path,
                       val_.labels->tokens.size(), val_.tokens->path, *job_.model.num_classes);
  }

 private:
  Cut cut_;
  // The first `texts` texts (data.limit.<key>): tokens up to the next separator after them.
  LabelledText first_texts(const LabelledText& d, std::optional<int64_t> texts,
                           const char* key) const {
    if (!texts || *texts >= static_cast<int64_t>(d.labels->tokens.size())) return d;
    // Texts and labels that disagree stay whole, for ClassifyBatches to name the files.
    const std::vector<int64_t> starts = text_starts(*d.tokens, ids_.separator);
    if (starts.size() != d.labels->tokens.size()) return d;
    auto tokens = std::make_shared<TokenShard>(*d.tokens);
    auto labels = std::make_shared<TokenShard>(*d.labels);
    tokens->tokens.resize(static_cast<size_t>(starts[static_cast<size_t>(*texts)] - 1));
    labels->tokens.resize(static_cast<size_t>(*texts));
    tokens->path = fmt::format("{} cut to {} texts by data.limit.{}", d.tokens->path, *texts, key);
    return {tokens, labels};
  }

  struct Ids {
    TokenId separator = -1, cls = -1, sep = -1, pad = -1;
  };
  const Job& job_;
  uint64_t seed_;
  DataShard shard_;
  LabelledText train_, val_;
  Ids ids_;
};

}  // namespace

std::optional<int> padding_token(const Job& job) {
  const ArchPreset* arch = find_arch(job.model.arch);
  if (!arch || arch->family != ModelFamily::bert || !job.model.num_classes) return std::nullopt;
  if (job.data.dataset == DatasetName::synthetic)
    return trained_special(job.model.vocab_size.value_or(0), Special::pad);
  if (!job.data.path) return std::nullopt;
  const std::filesystem::path file = std::filesystem::path(*job.data.path) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;  // open() says why
  return Tokenizer::load(file.string()).special(Special::pad);
}

int64_t count_labelled(const Tensor& labels) {
  const int32_t* l = labels.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) n += l[i] != kIgnoreLabel;
  return n;
}

int64_t steps_per_epoch(int64_t batches, const std::string& describe, const Job& job) {
  const int64_t per_epoch = batches / job.parallel.micro_batches;
  if (per_epoch <= 0) {
    throw Error(fmt::format("data.global_batch: {} samples per step, but the training set has {}",
                            job.data.global_batch, describe),
                "lower data.global_batch or data.micro_batch");
  }
  return per_epoch;
}

std::unique_ptr<DataSource> DataSource::open(const Job& job, uint64_t seed, DataShard shard) {
  const ArchPreset* arch = find_arch(job.model.arch);
  const bool lm = arch && is_language_model(arch->family);
  if (lm) {
    if (job.data.dataset != DatasetName::tokens && job.data.dataset != DatasetName::synthetic) {
      throw Error(fmt::format("data.dataset: {} is an image dataset, but model.arch {} reads "
                              "tokens",
                              to_string(job.data.dataset), job.model.arch),
                  "use data.dataset: tokens (with data.path from `dtrain data tokenize`) or "
                  "synthetic");
    }
    if (arch->family == ModelFamily::bert && job.model.num_classes)
      return std::make_unique<ClassifySource>(job, seed, shard);
    return std::make_unique<TextSource>(job, seed, shard);
  }
  if (job.data.dataset == DatasetName::tokens) {
    throw Error(fmt::format("data.dataset: tokens, but model.arch {} reads images", job.model.arch),
                "use an image dataset (fashion-mnist, mnist, cifar10, cifar100, image-folder, "
                "synthetic)");
  }
  return std::make_unique<ImageSource>(job, seed, shard);
}

}  // namespace dtrain::runtime
