// BERT (Devlin et al. 2019) as a graph builder, laid out as Hugging Face's
// BertModel: word + position + token-type embeddings -> LayerNorm -> dropout,
// then post-LN encoder layers (attention -> dropout -> add -> LN; GELU(erf)
// FFN -> dropout -> add -> LN), LN eps 1e-12; dropout on the attention
// probabilities too, at the same rate.
// The position table has model.max_positions rows (512) whatever seq_len is.
#pragma once

#include <cstdint>

#include "models/model.h"
#include "models/options.h"

namespace dtrain::models {

enum class BertHead : uint8_t {
  masked_lm,   // dense + GELU + LN + decoder tied to the word embeddings (+ bias [V])
  classifier,  // pooler (dense + tanh on token 0) + dropout + linear to num_classes
  pooler,      // BertModel as published: the pooler output is `logits`, no labels, no loss
};

// input ids i32 [B, T]. masked_lm: labels i32 [B, T] (-100 = not a masked
// position), logits [B, T, V]. classifier: labels i32 [B], logits [B, K].
// The registry picks masked_lm when num_classes is unset, classifier otherwise.
ModelGraph build_bert(const ModelOptions& options, int64_t batch, BertHead head,
                      const graph::DTypePolicy& policy = {});
ModelGraph build_bert(const ModelOptions& options, int64_t batch,
                      const graph::DTypePolicy& policy = {});

}  // namespace dtrain::models
