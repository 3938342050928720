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

// ---- images ----------------------------------------------------------------

class ImageFeed final : public DataFeed {
 public:
  ImageFeed(std::shared_ptr<const Dataset> set, const LoaderConfig& cfg, bool eval)
      : loader_(set, cfg), size_(set->size()), eval_(eval) {}

  const FeedBatch& next() override {
    const Batch& b = loader_.next();
    if (!labels_.defined()) labels_ = Tensor::empty(b.labels.shape(), DType::i32);
    std::memcpy(labels_.raw(), b.labels.raw(), b.labels.nbytes());
    if (eval_) {  // wrap-around padding counts for nothing (cross-entropy's ignore index)
      for (int64_t i = b.valid; i < labels_.numel(); ++i) labels_.data<int32_t>()[i] = -100;
    }
    batch_ = {b.images, labels_, b.next, b.epoch, count_labelled(labels_)};
    return batch_;
  }
  int64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  double wait_seconds() const override { return loader_.wait_seconds(); }
  std::string describe() const override { return fmt::format("{} images", size_); }

 private:
  Loader loader_;
  int64_t size_;
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
    if (job.data.limit.train) train_ = first_samples(train_, *job.data.limit.train);
    if (job.data.limit.test) test_ = first_samples(test_, *job.data.limit.test);
  }
  std::unique_ptr<DataFeed> feed(FeedSplit split, DataPosition start) const override {
    const bool eval = split == FeedSplit::eval;
    const LoaderConfig cfg =
        make_loader_config(job_.data, eval ? Split::test : Split::train, seed_, shard_.rank,
                           shard_.world, eval ? DataPosition{} : start);
    return std::make_unique<ImageFeed>(eval ? test_ : train_, cfg, eval);
  }

 private:
  const Job& job_;
  uint64_t seed_;
  DataShard shard_;
  std::shared_ptr<const Dataset> train_, test_;
};

// ---- tokens ----------------------------------------------------------------

class TextFeed final : public DataFeed {
 public:
  TextFeed(std::shared_ptr<const TokenShard> shard, const TextBatchConfig& cfg,
           DataPosition start = {})
      : batches_(shard, cfg, start), shard_(std::move(shard)) {}

  const FeedBatch& next() override {
    const TokenBatch b = batches_.next();
    batch_ = {b.input, b.labels, b.info.next, b.info.epoch, count_labelled(b.labels)};
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
    train_ = first_windows(train_, job.data.limit.train, seq, "train");
    val_ = first_windows(val_, job.data.limit.test, seq, "test");
    // Every run ends with an evaluation: a validation split without one window is refused
    // now (counting its windows), not after the training.
    feed(FeedSplit::eval, {});
  }

  std::unique_ptr<DataFeed> feed(FeedSplit split, DataPosition start) const override {
    TextBatchConfig cfg;
    cfg.task = task_;
    cfg.seq_len = job_.model.seq_len.value_or(0);
    cfg.batch = job_.data.micro_batch;
    cfg.rank = shard_.rank;
    cfg.world = shard_.world;
    cfg.seed = seed_;
    cfg.masking = masking_;
    if (split == FeedSplit::eval) {
      cfg.order = TextOrder::sequential;
      return std::make_unique<TextFeed>(val_, cfg);
    }
    return std::make_unique<TextFeed>(train_, cfg, start);
  }

 private:
  void open_shards(int64_t vocab) {
    if (!job_.data.path) {
      throw Error("data.path: the tokens dataset needs the directory `dtrain data tokenize` wrote",
                  "run `dtrain data tokenize --input TEXT... --vocab-size N --out DIR`, then set "
                  "data.path: DIR");
    }
    const std::string& dir = *job_.data.path;
    if (!std::filesystem::is_directory(dir)) {
      throw Error(fmt::format("data.path: {} is not a directory", dir),
                  fmt::format("tokenize a corpus first, e.g. `dtrain data tokenize --input "
                              "/usr/share/games/fortunes --vocab-size 8192 --out {}`",
                              dir));
    }
    TextData data = open_text_data(dir);
    if (data.tokenizer->vocab_size() > vocab) {
      throw Error(fmt::format("model.vocab_size: {} is smaller than the {} tokens of {}/"
                              "tokenizer.json",
                              vocab, data.tokenizer->vocab_size(), dir),
                  fmt::format("set model.vocab_size: {}", data.tokenizer->vocab_size()));
    }
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

}  // namespace

int64_t count_labelled(const Tensor& labels) {
  const int32_t* l = labels.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) n += l[i] != kIgnoreLabel;
  return n;
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
    if (arch->family == ModelFamily::bert && job.model.num_classes) {
      throw Error(
          "model.num_classes: BERT sequence classification needs a labelled text dataset, "
          "which dtrain does not read yet",
          "remove model.num_classes to pretrain with the masked-LM objective");
    }
    return std::make_unique<TextSource>(job, seed, shard);
  }
  if (job.data.dataset == DatasetName::tokens) {
    throw Error(fmt::format("data.dataset: tokens, but model.arch {} reads images", job.model.arch),
                "use an image dataset (fashion-mnist, mnist, cifar10, cifar100, synthetic)");
  }
  return std::make_unique<ImageSource>(job, seed, shard);
}

}  // namespace dtrain::runtime
