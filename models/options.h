// Typed options of the model library: the architecture name and its shape
// hyper-parameters, plus the table of built-in architectures with their presets.
// Keys an architecture does not use stay unset. No graph building here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/enum_names.h"

namespace dtrain {

enum class ModelFamily : uint8_t { cnn, vit, bert, gpt };

// A ResNet's first layers: standard = 7x7/2 conv + 3x3/2 max-pool (ImageNet,
// /4 before layer1); small = one 3x3/1 conv, no pool (28-32 px inputs: MNIST, CIFAR).
enum class ResNetStem : uint8_t { standard, small };
inline constexpr std::pair<ResNetStem, std::string_view> kResNetStemNames[] = {
    {ResNetStem::standard, "standard"}, {ResNetStem::small, "small"}};
inline std::string_view to_string(ResNetStem v) { return enum_name(kResNetStemNames, v); }
inline bool from_string(std::string_view text, ResNetStem& out) {
  return enum_parse(kResNetStemNames, text, out);
}
inline const auto& enum_names(ResNetStem) { return kResNetStemNames; }

struct ModelOptions {
  std::string arch;
  std::optional<int> num_classes;          // cnn, vit; bert: unset means masked-LM pretraining
  std::optional<int> image_size;           // cnn, vit
  std::optional<int> in_channels;          // cnn, vit
  std::optional<ResNetStem> stem;          // cnn
  std::optional<double> width;             // cnn: multiplier on every channel width (rounded, >= 1)
  std::optional<bool> zero_init_residual;  // cnn: last BN gamma of each block starts at 0
  std::optional<int> patch_size;           // vit
  std::optional<int> seq_len;              // bert, gpt (and the token count of a vit is derived)
  // bert, gpt: rows of the learned position table, fixed by the architecture (BERT
  // 512, GPT-2 1024) so a shorter seq_len keeps the checkpoint shape; seq_len <= it.
  std::optional<int> max_positions;
  std::optional<int> vocab_size;  // bert, gpt
  std::optional<int> layers;      // transformer blocks
  std::optional<int> hidden;      // model width
  std::optional<int> heads;       // attention heads; hidden % heads == 0
  std::optional<int> ffn;         // MLP width
  std::optional<double> dropout;  // transformers
  // Every family: the loss's target is (1 - e) one-hot + e / classes in training (the
  // evaluations are plain cross-entropy: graph::softmax_cross_entropy).
  double label_smoothing = 0.0;
  // bert masked-LM: positions predicted per sequence, the prediction head's row
  // count (not a job-file key: resolved from data.mlm_probability); unset means
  // masked_lm_predictions(seq_len, 0.15).
  std::optional<int> mlm_predictions;
  // bert classifier: the [PAD] id of the tokenizer its data came from (not a job-file
  // key: the trainer reads it from data.path's tokenizer.json); attention ignores keys
  // holding it. Unset: nothing is masked (synthetic data, `dtrain estimate`).
  std::optional<int> pad_token_id;
  // A safetensors file of the family's reference weights to start from (`dtrain ckpt
  // export` writes one); read by the trainer, ignored by the graph builders.
  std::optional<std::string> init_from;
};

// Masked-LM positions predicted per sequence of T tokens: round(probability * T),
// at least 1 and at most T. The loader selects exactly this many per window, so
// the head gathers a fixed [B, M] set of rows instead of predicting all B*T.
inline int64_t masked_lm_predictions(int64_t seq_len, double probability) {
  const auto m = static_cast<int64_t>(std::llround(probability * static_cast<double>(seq_len)));
  return std::clamp<int64_t>(m, 1, seq_len);
}

struct ArchPreset {
  std::string_view name;
  ModelFamily family;
  int layers;  // transformer blocks (0 for CNNs: depth is in the name)
  int hidden;
  int heads;
};

inline constexpr ArchPreset kArchPresets[] = {
    {"resnet18", ModelFamily::cnn, 0, 0, 0},
    {"resnet34", ModelFamily::cnn, 0, 0, 0},
    {"resnet50", ModelFamily::cnn, 0, 0, 0},
    {"resnet101", ModelFamily::cnn, 0, 0, 0},
    {"resnet152", ModelFamily::cnn, 0, 0, 0},
    {"bert-tiny", ModelFamily::bert, 2, 128, 2},
    {"bert-mini", ModelFamily::bert, 4, 256, 4},
    {"bert-small", ModelFamily::bert, 4, 512, 8},
    {"bert-base", ModelFamily::bert, 12, 768, 12},
    {"bert-large", ModelFamily::bert, 24, 1024, 16},
    {"vit-tiny", ModelFamily::vit, 12, 192, 3},
    {"vit-small", ModelFamily::vit, 12, 384, 6},
    {"vit-base", ModelFamily::vit, 12, 768, 12},
    {"vit-large", ModelFamily::vit, 24, 1024, 16},
    {"gpt2-tiny", ModelFamily::gpt, 4, 256, 4},
    {"gpt2", ModelFamily::gpt, 12, 768, 12},
    {"gpt2-medium", ModelFamily::gpt, 24, 1024, 16},
    {"gpt2-large", ModelFamily::gpt, 36, 1280, 20},
    {"gpt2-xl", ModelFamily::gpt, 48, 1600, 25},
};

inline const ArchPreset* find_arch(std::string_view name) {
  for (const auto& a : kArchPresets)
    if (a.name == name) return &a;
  return nullptr;
}

inline std::string_view to_string(ModelFamily f) {
  switch (f) {
    case ModelFamily::cnn:
      return "CNN";
    case ModelFamily::vit:
      return "vision transformer";
    case ModelFamily::bert:
      return "BERT encoder";
    case ModelFamily::gpt:
      return "GPT decoder";
  }
  return "?";
}

inline bool is_language_model(ModelFamily f) {
  return f == ModelFamily::bert || f == ModelFamily::gpt;
}

// The defaults of an architecture: every key it uses is set, every other key unset.
inline ModelOptions preset_options(const ArchPreset& a) {
  ModelOptions m;
  m.arch = std::string(a.name);
  if (!is_language_model(a.family)) {
    m.num_classes = 1000;
    m.image_size = 224;
    m.in_channels = 3;
  }
  if (a.family == ModelFamily::cnn) {
    m.stem = ResNetStem::standard;
    m.width = 1.0;
    m.zero_init_residual = true;
    return m;
  }
  m.layers = a.layers;
  m.hidden = a.hidden;
  m.heads = a.heads;
  m.ffn = 4 * a.hidden;
  m.dropout = a.family == ModelFamily::vit ? 0.0 : 0.1;
  if (a.family == ModelFamily::vit) m.patch_size = 16;
  if (a.family == ModelFamily::bert) {
    m.seq_len = 128;
    m.max_positions = 512;
    m.vocab_size = 30522;
  }
  if (a.family == ModelFamily::gpt) {
    m.seq_len = 1024;
    m.max_positions = 1024;
    m.vocab_size = 50257;
  }
  return m;
}

}  // namespace dtrain
