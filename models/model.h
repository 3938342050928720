// What every model builder returns: the static training graph of one device
// for a fixed micro-batch, and the ids of the values a trainer feeds and reads.
// No parameters are allocated here (an Executor over `graph` does that).
#pragma once

#include "graph/graph.h"

namespace dtrain::models {

struct ModelGraph {
  graph::Graph graph;
  graph::ValueId input = -1;   // images f32 [N, C, H, W] (token ids i32 [B, T] for language models)
  graph::ValueId labels = -1;  // class ids i32 [N]
  graph::ValueId logits = -1;  // f32 [N, K]
  graph::ValueId loss = -1;    // mean softmax cross-entropy, f32 [1]
};

}  // namespace dtrain::models
