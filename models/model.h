// What every model builder returns: the static training graph of one device
// for a fixed micro-batch, and the ids of the values a trainer feeds and reads.
// No parameters are allocated here (an Executor over `graph` does that).
#pragma once

#include "graph/graph.h"

namespace dtrain::models {

// Shapes: image classifiers (ResNet, ViT) and BERT with num_classes take
// input [N, C, H, W] f32 / ids i32 [B, T], labels i32 [N], logits [N, K] in the
// graph's compute dtype (DTypePolicy: f32, f16 or bf16; so are all activations).
// Language models (BERT masked-LM, GPT-2) take ids i32 [B, T] and labels i32
// [B, T] (BERT: the original token at masked positions, -100 elsewhere; GPT-2:
// the next token), logits f32 [B, T, V]; the loss is the mean over the labelled
// tokens. A graph without a loss (BERT's pooler-only variant) has labels = loss = -1.
struct ModelGraph {
  graph::Graph graph;
  graph::ValueId input = -1;   // images f32 [N, C, H, W], or token ids i32 [B, T]
  graph::ValueId labels = -1;  // class ids i32 [N], or token ids i32 [B, T]
  graph::ValueId logits = -1;  // f32 [N, K], or [B, T, V] (BERT masked-LM: [B, M, V])
  // The labels the loss compares logits with, row for row: `labels` itself,
  // except for BERT's masked-LM head, which gathers the M labelled positions of
  // each sequence (i32 [B, M], kIgnoreLabel where a sequence had fewer).
  graph::ValueId targets = -1;
  graph::ValueId loss = -1;  // mean softmax cross-entropy, f32 [1]
};

}  // namespace dtrain::models
