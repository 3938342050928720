// GPT-2 (Radford et al. 2019) as a graph builder, laid out as Hugging Face's
// GPT2LMHeadModel: token + position embeddings -> dropout, pre-LN blocks with
// causal attention and a GELU(tanh) MLP, final LN, LM head tied to the token
// embedding (no bias). Dropout after the embeddings, on the attention
// probabilities and on each residual branch. The position table has max_positions rows.
#pragma once

#include <cstdint>

#include "models/model.h"
#include "models/options.h"

namespace dtrain::models {

// input ids i32 [B, T], labels i32 [B, T] (the next token of each position; -100
// ignored) -> logits [B, T, V], mean cross-entropy over the labelled tokens.
// Init: N(0, 0.02^2), the residual projections (attn.c_proj, mlp.c_proj)
// N(0, (0.02 / sqrt(2 * layers))^2), biases 0, LN gamma 1.
ModelGraph build_gpt2(const ModelOptions& options, int64_t batch,
                      const graph::DTypePolicy& policy = {});

// The epsilon of every layer norm of the graph (Hugging Face's layer_norm_epsilon); the
// generation decoder (runtime/decoder.h) uses it too.
inline constexpr float kGpt2LayerNormEps = 1e-5f;

}  // namespace dtrain::models
