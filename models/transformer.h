// What the transformer builders (BERT, ViT, GPT-2) share: the resolved shape
// keys with their checks, and the attention and MLP sub-blocks. Residuals,
// norms and their order (pre-LN or post-LN) stay in each model's file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "graph/graph.h"
#include "graph/ops.h"
#include "models/options.h"

namespace dtrain::models {

// The keys a transformer reads, with the arch's preset where unset. Image keys
// are 0 for language models and vocab / positions 0 for a ViT.
struct TransformerShape {
  int64_t layers = 0, hidden = 0, heads = 0, ffn = 0;
  double dropout = 0.0;
  int64_t vocab = 0, seq_len = 0, max_positions = 0;  // bert, gpt
  int64_t image = 0, patch = 0, channels = 0;         // vit
  std::optional<int64_t> classes;                     // vit; bert: unset = masked LM
};

// Throws Error naming the key (model.heads and model.hidden, model.patch_size and
// model.image_size, model.seq_len and model.max_positions, ...) on bad values.
TransformerShape resolve_transformer(const ModelOptions& options, ModelFamily family);

// Weights N(0, 0.02^2), as BERT, GPT-2 and ViT initialise their linear layers.
inline constexpr double kInitStd = 0.02;

struct AttentionNames {
  std::string qkv, core, proj;  // node names of the fused projection, the attention, the output
};
// x [B, T, C] -> qkv linear -> self_attention -> proj linear -> [B, T, C]; key_mask
// (u8 [B, T], graph::padding_mask) hides padded keys, -1: none.
graph::ValueId attention_block(graph::Graph& g, const AttentionNames& names, graph::ValueId x,
                               const TransformerShape& s, kernels::Causal causal,
                               double proj_std = kInitStd, graph::ValueId key_mask = -1);

struct MlpNames {
  std::string fc1, act, fc2;
};
// x [B, T, C] -> linear (C -> ffn) -> act -> linear (ffn -> C); a tanh-GELU is fused
// into the first linear (graph::linear_gelu), so names.act then names no node.
graph::ValueId mlp_block(graph::Graph& g, const MlpNames& names, graph::ValueId x,
                         const TransformerShape& s, kernels::Activation act,
                         double fc2_std = kInitStd);

// A dropout node, or x itself when p = 0 (no copy, no mask).
graph::ValueId maybe_dropout(graph::Graph& g, const std::string& name, graph::ValueId x, double p);

}  // namespace dtrain::models
