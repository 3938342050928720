// Language-model batches from a token shard: causal-LM (GPT: labels are the inputs
// shifted by one) and masked-LM (BERT: 15% of positions predicted). Windows are
// cut at stride T; the image Sampler orders them per epoch and shards them by
// rank, so a batch is a pure function of (seed, epoch, batch index, rank, world)
// and DataPosition is the checkpointed position. Tokenizing lives in tokenizer.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/sampler.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"

namespace dtrain {

enum class LmTask : uint8_t { causal, masked };
// shuffled (training): per-epoch window order and start offset from the seed, the
// last partial global batch dropped. sequential (evaluation): windows in file
// order from token 0, the last batch padded by wrapping around with its padding
// rows' labels all kIgnoreLabel, masks from kEvalMaskSeed, the same every epoch.
enum class TextOrder : uint8_t { shuffled, sequential };

inline constexpr int32_t kIgnoreLabel = -100;                     // cross-entropy's ignore_index
inline constexpr uint64_t kEvalMaskSeed = 0x6576616c6d61736bull;  // "evalmask"

// Masked-LM: exactly `predictions` ordinary positions (id < first_special) of
// each window are selected (fewer only where the window has fewer ordinary
// tokens), uniformly without replacement from the seed: Google BERT's
// max_predictions_per_seq, so the model's prediction head has a fixed row count
// (models::masked_lm_predictions: round(probability * T), at least 1). A
// selected position becomes mask_id (80%), a uniform ordinary id (10%) or stays
// (10%), and its label is the original id; all other labels are kIgnoreLabel.
// Special tokens (<|endoftext|> between documents) are never selected.
struct MaskingConfig {
  int64_t predictions = 1;  // per window, 1..T
  TokenId mask_id = -1;
  TokenId first_special = -1;  // Tokenizer::first_special()
};

struct TextBatchConfig {
  LmTask task = LmTask::causal;
  int64_t seq_len = 0;  // T
  int64_t batch = 1;    // B, per rank
  int rank = 0;
  int world = 1;
  int64_t micro_steps = 1;  // batches per optimizer step (SamplerConfig::micro_steps)
  uint64_t seed = 0;
  TextOrder order = TextOrder::shuffled;
  MaskingConfig masking;  // LmTask::masked only
  std::string cut_by;     // the key that cut the shard (data.limit.train), when one did
};

struct TokenBatch {
  Tensor input;   // i32 [B, T]
  Tensor labels;  // i32 [B, T]
  BatchInfo info;
};

// Windows: causal ones hold T+1 tokens (inputs [s, s+T), labels [s+1, s+T+1)),
// masked ones T; window k of an epoch starts at offset + k*T. There are
// W = (n-1)/T causal (n/T masked) windows in n tokens; the offset is uniform in
// [0, slack] (slack: the tokens left over by the W windows), drawn per epoch from
// Philox(seed, (text_offset, epoch)), so each epoch sees slightly shifted windows.
class TextBatches {
 public:
  TextBatches(std::shared_ptr<const TokenShard> shard, TextBatchConfig config,
              DataPosition start = {});

  // This rank's next batch into input and labels, i32 [B, T] row-major each;
  // window_ids (B, optional) receives the window index of each row.
  BatchInfo next(int32_t* input, int32_t* labels, int64_t* window_ids = nullptr);
  TokenBatch next();
  DataPosition position() const { return sampler_.position(); }
  int64_t windows() const { return windows_; }
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  // The first token of window `window` in epoch `epoch`.
  int64_t window_start(int64_t epoch, int64_t window) const;

 private:
  void fill_masked(int64_t epoch, int64_t window, const TokenId* tokens, int32_t* input,
                   int32_t* labels) const;

  std::shared_ptr<const TokenShard> shard_;
  TextBatchConfig config_;
  int64_t windows_ = 0;
  int64_t slack_ = 0;
  Sampler sampler_;
  std::vector<int64_t> rows_;
};

// Text classification (BERT with a classifier head): one labelled text per row.
// A shard from `dtrain data tokenize --labelled` holds <|endoftext|> before each
// text (as every shard does); its labels file holds one class per text, in order.
// Row of text k: [CLS], its first T - 2 tokens, [SEP], then [PAD] up to T (the model
// masks the [PAD] keys); the label is its class. The Sampler orders the texts per
// epoch and shards them by rank as it does image samples; evaluation pads its last
// batch by wrapping around, those rows' labels kIgnoreLabel.
struct LabelledText {
  std::shared_ptr<const TokenShard> tokens;  // train.bin / val.bin
  std::shared_ptr<const TokenShard> labels;  // train.labels.bin / val.labels.bin
};
struct ClassifyConfig {
  int64_t seq_len = 0;  // T, at least 2
  int64_t batch = 1;    // B, per rank
  int rank = 0;
  int world = 1;
  int64_t micro_steps = 1;  // batches per optimizer step (SamplerConfig::micro_steps)
  uint64_t seed = 0;
  TextOrder order = TextOrder::shuffled;
  TokenId separator = -1;  // the id before each text in the shard (<|endoftext|>)
  TokenId cls = -1, sep = -1, pad = -1;
  std::string cut_by;  // the key that cut the texts (data.limit.train), when one did
};
// Where each text of a shard starts: the token after each separator.
std::vector<int64_t> text_starts(const TokenShard& shard, TokenId separator);

class ClassifyBatches {
 public:
  ClassifyBatches(LabelledText data, ClassifyConfig config, DataPosition start = {});
  // input i32 [B, T], labels i32 [B]
  BatchInfo next(int32_t* input, int32_t* labels);
  int64_t texts() const { return static_cast<int64_t>(starts_.size()); }
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  const std::string& path() const { return data_.tokens->path; }

 private:
  LabelledText data_;
  ClassifyConfig config_;
  std::vector<int64_t> starts_;  // the first token of each text, after its separator
  Sampler sampler_;
  std::vector<int64_t> rows_;
};

// What `dtrain data tokenize` writes into one directory (data.path).
struct TextData {
  std::shared_ptr<const Tokenizer> tokenizer;  // dir/tokenizer.json
  std::shared_ptr<const TokenShard> train;     // dir/train.bin
  std::shared_ptr<const TokenShard> val;       // dir/val.bin
  // --labelled: dir/labels.json (the class names) and one class per text of each shard
  // (dir/train.labels.bin, dir/val.labels.bin); all empty for a language-model corpus.
  std::vector<std::string> classes;
  std::shared_ptr<const TokenShard> train_labels, val_labels;
};
// Loads and cross-checks the files (the shards' vocab size is the tokenizer's; a labels
// shard's is the class count, and it holds one label per text of its token shard).
TextData open_text_data(const std::string& dir);
// dir/labels.json: {"classes": [names in id order]}, written atomically.
void write_class_names(const std::string& dir, const std::vector<std::string>& names);
// The names a labels.json holds (at least two), or an Error naming the file.
std::vector<std::string> read_class_names(const std::filesystem::path& file);

}  // namespace dtrain
