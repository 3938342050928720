// Window geometry, the per-epoch offset, causal rows, masked rows, and loading of
// a tokenized directory. Masking draws one Philox block per (window, position):
// stream (mask, window), block (epoch << 32 | position); words: select, action,
// replacement id. The fallback position of an unselected window uses block
// (epoch << 32 | 0xffffffff).
#include "data/text_loader.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/atomic_file.h"
#include "data/file_bytes.h"
#include "data/rng_streams.h"

namespace dtrain {
namespace {

int64_t window_tokens(const TextBatchConfig& c) {
  return c.task == LmTask::causal ? c.seq_len + 1 : c.seq_len;
}

// W windows at stride T need (W-1)*T + window tokens; causal windows overlap by one.
int64_t count_windows(const TokenShard& shard, const TextBatchConfig& c) {
  DTRAIN_CHECK(c.seq_len > 0 && c.batch > 0 && c.world > 0, "T {} B {} world {}", c.seq_len,
               c.batch, c.world);
  const auto n = static_cast<int64_t>(shard.tokens.size());
  const int64_t need = window_tokens(c);
  if (n < need)
    throw Error(fmt::format("{}: {} tokens, fewer than one window of {} (sequence length {}{})",
                            shard.path, n, need, c.seq_len,
                            c.task == LmTask::causal ? " + 1 for the shifted labels" : ""),
                c.cut_by.empty() ? "lower model.seq_len, or tokenize more text"
                                 : fmt::format("raise {}, or lower model.seq_len", c.cut_by));
  const int64_t w = c.task == LmTask::causal ? (n - 1) / c.seq_len : n / c.seq_len;
  const int64_t global = c.batch * c.world * c.micro_steps;
  if (c.order == TextOrder::shuffled && w < global)
    throw Error(
        fmt::format("{}: {} tokens make {} windows of {}, fewer than {}", shard.path, n, w,
                    c.seq_len, global_batch_phrase(c.batch, c.world, c.micro_steps)),
        c.cut_by.empty()
            ? "lower data.global_batch or model.seq_len, or tokenize more text"
            : fmt::format("raise {}, or lower data.global_batch or model.seq_len", c.cut_by));
  return w;
}

// Windows or texts as the Sampler's samples: shuffled and cut with the last partial
// global batch dropped for training, in order with the last one padded for evaluation.
template <class Config>
SamplerConfig sampler_config(int64_t samples, const Config& c) {
  SamplerConfig s;
  s.dataset_size = samples;
  s.batch = c.batch;
  s.rank = c.rank;
  s.world = c.world;
  s.micro_steps = c.micro_steps;
  s.seed = c.seed;
  const bool train = c.order == TextOrder::shuffled;
  s.shuffle = train ? Shuffle::on : Shuffle::off;
  s.tail = train ? Tail::drop : Tail::pad;
  return s;
}

// Multiply-shift of a 32-bit draw onto [0, n).
int64_t below(uint32_t u, int64_t n) {
  return static_cast<int64_t>((uint64_t{u} * static_cast<uint64_t>(n)) >> 32);
}

}  // namespace

TextBatches::TextBatches(std::shared_ptr<const TokenShard> shard, TextBatchConfig config,
                         DataPosition start)
    : shard_(std::move(shard)),
      config_(config),
      windows_(count_windows(*shard_, config_)),
      slack_(static_cast<int64_t>(shard_->tokens.size()) -
             ((windows_ - 1) * config_.seq_len + window_tokens(config_))),
      sampler_(sampler_config(windows_, config_), start),
      rows_(static_cast<size_t>(config_.batch)) {
  if (config_.task == LmTask::masked) {
    const MaskingConfig& m = config_.masking;
    DTRAIN_CHECK(
        m.first_special > 0 && m.mask_id >= m.first_special && m.mask_id < shard_->vocab_size,
        "mask id {} first special {} vocab {}", m.mask_id, m.first_special, shard_->vocab_size);
    DTRAIN_CHECK(m.predictions >= 1 && m.predictions <= config_.seq_len,
                 "masked-LM predictions {} per window of {}", m.predictions, config_.seq_len);
  }
}

int64_t TextBatches::window_start(int64_t epoch, int64_t window) const {
  int64_t offset = 0;
  if (config_.order == TextOrder::shuffled && slack_ > 0) {
    const Philox rng(config_.seed,
                     rng_stream_id(data_rng::kTextOffset, 0, static_cast<uint64_t>(epoch)));
    offset = below(rng.u32(0), slack_ + 1);
  }
  return offset + window * config_.seq_len;
}

void TextBatches::fill_masked(int64_t epoch, int64_t window, const TokenId* tokens, int32_t* input,
                              int32_t* labels) const {
  const MaskingConfig& m = config_.masking;
  const bool eval = config_.order == TextOrder::sequential;
  const Philox rng(eval ? kEvalMaskSeed : config_.seed,
                   rng_stream_id(data_rng::kMask, 0, static_cast<uint64_t>(window)));
  const uint64_t epoch_bits = static_cast<uint64_t>(eval ? 0 : epoch) << 32;
  const int64_t t_len = config_.seq_len;
  // Every ordinary position draws a key (word 0); the `predictions` smallest
  // keys (ties: the earlier position) are selected, and a selected position
  // becomes [MASK] / a random ordinary id / itself by word 1.
  struct Draw {
    uint32_t key;
    int32_t pos;
  };
  std::vector<Draw> draws(static_cast<size_t>(t_len));
  int64_t ordinary = 0;
  for (int64_t p = 0; p < t_len; ++p) {
    input[p] = tokens[p];
    labels[p] = kIgnoreLabel;
    if (tokens[p] >= m.first_special) continue;
    const PhiloxCounter w = rng.block(epoch_bits | static_cast<uint64_t>(p));
    draws[static_cast<size_t>(ordinary++)] = {w[0], static_cast<int32_t>(p)};
  }
  const int64_t k = std::min(m.predictions, ordinary);
  auto before = [](const Draw& a, const Draw& b) {
    return a.key != b.key ? a.key < b.key : a.pos < b.pos;
  };
  std::nth_element(draws.begin(), draws.begin() + k, draws.begin() + ordinary, before);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t p = draws[static_cast<size_t>(i)].pos;
    const PhiloxCounter w = rng.block(epoch_bits | static_cast<uint64_t>(p));
    labels[p] = tokens[p];
    const float action = u32_to_uniform(w[1]);
    if (action < 0.8f) {
      input[p] = m.mask_id;
    } else if (action < 0.9f) {
      input[p] = static_cast<int32_t>(below(w[2], m.first_special));
    }
  }
}

BatchInfo TextBatches::next(int32_t* input, int32_t* labels, int64_t* window_ids) {
  const BatchInfo info = sampler_.next(rows_.data());
  const int64_t t_len = config_.seq_len;
  const TokenId* tokens = shard_->tokens.data();
  for (int64_t b = 0; b < config_.batch; ++b) {
    const int64_t window = rows_[static_cast<size_t>(b)];
    if (window_ids != nullptr) window_ids[b] = window;
    const TokenId* w = tokens + window_start(info.epoch, window);
    int32_t* in = input + b * t_len;
    int32_t* lab = labels + b * t_len;
    if (config_.task == LmTask::causal) {
      std::copy(w, w + t_len, in);
      std::copy(w + 1, w + t_len + 1, lab);
    } else {
      fill_masked(info.epoch, window, w, in, lab);
    }
    if (b >= info.valid) std::fill(lab, lab + t_len, kIgnoreLabel);
  }
  return info;
}

TokenBatch TextBatches::next() {
  TokenBatch out;
  out.input = Tensor::empty({config_.batch, config_.seq_len}, DType::i32);
  out.labels = Tensor::empty({config_.batch, config_.seq_len}, DType::i32);
  out.info = next(out.input.data<int32_t>(), out.labels.data<int32_t>());
  return out;
}

std::vector<int64_t> text_starts(const TokenShard& shard, TokenId separator) {
  std::vector<int64_t> starts;
  for (size_t i = 0; i < shard.tokens.size(); ++i)
    if (shard.tokens[i] == separator) starts.push_back(static_cast<int64_t>(i) + 1);
  return starts;
}

namespace {

// The texts' sampler, after checking that the labels match the texts and that there
// are enough of them.
SamplerConfig classify_sampler(const LabelledText& data, const ClassifyConfig& c, int64_t n) {
  DTRAIN_CHECK(c.seq_len >= 2 && c.batch > 0 && c.world > 0, "T {} B {} world {}", c.seq_len,
               c.batch, c.world);
  if (n != static_cast<int64_t>(data.labels->tokens.size())) {
    throw Error(fmt::format("{}: {} texts, but {} holds {} labels", data.tokens->path, n,
                            data.labels->path, data.labels->tokens.size()),
                "the two files come from different runs; run `dtrain data tokenize "
                "--labelled` again into an empty directory");
  }
  const bool train = c.order == TextOrder::shuffled;
  const int64_t global = c.batch * c.world * c.micro_steps;
  if (n == 0 || (train && n < global)) {
    throw Error(fmt::format("{}: {} texts, fewer than {}", data.tokens->path, n,
                            train ? global_batch_phrase(c.batch, c.world, c.micro_steps)
                                  : std::string("one")),
                !c.cut_by.empty() ? fmt::format("raise {}{}", c.cut_by,
                                                train ? ", or lower data.global_batch" : "")
                : train           ? "lower data.global_batch, or give more texts"
                        : "tokenize again with a larger --val-fraction, so that the validation "
                          "split holds texts");
  }
  return sampler_config(n, c);
}

}  // namespace

ClassifyBatches::ClassifyBatches(LabelledText data, ClassifyConfig config, DataPosition start)
    : data_(std::move(data)),
      config_(config),
      starts_(text_starts(*data_.tokens, config_.separator)),
      sampler_(classify_sampler(data_, config_, static_cast<int64_t>(starts_.size())), start),
      rows_(static_cast<size_t>(config_.batch)) {}

BatchInfo ClassifyBatches::next(int32_t* input, int32_t* labels) {
  const BatchInfo info = sampler_.next(rows_.data());
  const int64_t t_len = config_.seq_len;
  const std::vector<TokenId>& tokens = data_.tokens->tokens;
  const auto n = static_cast<int64_t>(starts_.size());
  for (int64_t b = 0; b < config_.batch; ++b) {
    const int64_t k = rows_[static_cast<size_t>(b)];
    const int64_t begin = starts_[static_cast<size_t>(k)];
    const int64_t end =
        k + 1 < n ? starts_[static_cast<size_t>(k + 1)] - 1 : static_cast<int64_t>(tokens.size());
    const int64_t len = std::min(end - begin, t_len - 2);
    int32_t* row = input + b * t_len;
    row[0] = config_.cls;
    std::copy(tokens.begin() + begin, tokens.begin() + begin + len, row + 1);
    row[len + 1] = config_.sep;
    std::fill(row + len + 2, row + t_len, config_.pad);
    labels[b] = b < info.valid ? data_.labels->tokens[static_cast<size_t>(k)] : kIgnoreLabel;
  }
  return info;
}

namespace {

constexpr const char* kRetokenize =
    "the files come from different runs; run `dtrain data tokenize` again into an empty "
    "directory";

}  // namespace

std::vector<std::string> read_class_names(const std::filesystem::path& file) {
  const FileBytes f = read_file_bytes(file.string(), kRetokenize);
  try {
    const auto j = nlohmann::json::parse(f.bytes.begin(), f.bytes.end());
    auto names = j.at("classes").get<std::vector<std::string>>();
    if (names.size() < 2) throw Error(fmt::format("{}: fewer than two classes", file.string()));
    return names;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a labels file: {}", file.string(), e.what()),
                "expected {\"classes\": [names]}, as `dtrain data tokenize --labelled` writes");
  }
}

void write_class_names(const std::string& dir, const std::vector<std::string>& names) {
  const std::string text = nlohmann::json{{"classes", names}}.dump(1) + "\n";
  write_file_atomic((std::filesystem::path(dir) / "labels.json").string(), {text});
}

TextData open_text_data(const std::string& dir) {
  const std::filesystem::path d(dir);
  TextData data;
  data.tokenizer =
      std::make_shared<const Tokenizer>(Tokenizer::load((d / "tokenizer.json").string()));
  data.train = std::make_shared<const TokenShard>(read_token_shard((d / "train.bin").string()));
  data.val = std::make_shared<const TokenShard>(read_token_shard((d / "val.bin").string()));
  for (const auto& shard : {data.train, data.val}) {
    if (shard->vocab_size != data.tokenizer->vocab_size())
      throw Error(fmt::format("{}: vocab size {}, but {}/tokenizer.json has {}", shard->path,
                              shard->vocab_size, dir, data.tokenizer->vocab_size()),
                  "the shards and the tokenizer come from different runs; run `dtrain data "
                  "tokenize` again into an empty directory");
  }
  std::error_code ec;
  if (!std::filesystem::exists(d / "labels.json", ec)) return data;
  data.classes = read_class_names(d / "labels.json");
  for (const char* name : {"train.labels.bin", "val.labels.bin"}) {
    if (!std::filesystem::exists(d / name, ec)) {
      throw Error(fmt::format("{}: missing, but {}/labels.json says the directory holds "
                              "labelled texts",
                              (d / name).string(), dir),
                  "run `dtrain data tokenize --labelled ...` into this directory again");
    }
  }
  data.train_labels =
      std::make_shared<const TokenShard>(read_token_shard((d / "train.labels.bin").string()));
  data.val_labels =
      std::make_shared<const TokenShard>(read_token_shard((d / "val.labels.bin").string()));
  for (const auto& shard : {data.train_labels, data.val_labels}) {
    if (shard->vocab_size != static_cast<int64_t>(data.classes.size()))
      throw Error(fmt::format("{}: {} classes, but {}/labels.json names {}", shard->path,
                              shard->vocab_size, dir, data.classes.size()),
                  kRetokenize);
  }
  return data;
}

}  // namespace dtrain
