// Tensor parallelism as a pass over a single-device graph (Megatron's split, applied
// from outside: model builders never see it). It finds what it knows how to split:
//  - a linear whose output reaches exactly one later linear through element-wise
//    activations and at most one self-attention: the first splits its output
//    features (column), the second its input features (row), the attention its
//    heads (a fused q, k, v projection splits each of q, k and v alike): a
//    transformer's attention and its MLP, one all-reduce each way;
//  - a token embedding splits its vocabulary (table rows), and a linear tied to that
//    table (GPT-2's head, BERT's decoder) its output classes, which only a
//    softmax cross-entropy may read: it meets the other ranks' classes in two small
//    all-reduces, never gathering the logits.
// Everything else is replicated: every rank computes it whole, from the same bits,
// so its parameters get the same gradients on every rank. Node order and names stay,
// so random streams (dropout) and parameter names are the one-rank graph's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/tensor_share.h"

namespace dtrain::graph {

struct TensorParallelPlan {
  int size = 1, rank = 0;
  struct Split {
    int node = -1;
    TpShare share;  // without its group
  };
  std::vector<Split> splits;  // node order
  // The vocabulary-split values (the logits of a tied head), their classes
  // [begin, begin + count) of total here; empty when nothing is.
  std::vector<ValueId> vocab_values;
  int64_t vocab_begin = 0, vocab_count = 0, vocab_total = 0;
  const Split* find(int node) const;
};

// What would be split on rank `rank` of `size`. Throws Error naming parallel.tensor
// and the model key (heads, ffn) a degree does not divide, or the node that reads
// vocabulary-split logits other than a cross-entropy; `size` 1 plans nothing.
TensorParallelPlan plan_tensor_parallel(const Graph& g, int size, int rank);
// Rewrites `g` for group->rank() of group->size() (Graph::replace_ops); returns the plan.
TensorParallelPlan split_tensor_parallel(Graph& g, std::shared_ptr<TensorGroup> group);

// One line per split node ("transformer.h.0.attn.c_attn  column  features 0-31 of 64 (x3)").
std::string format_tensor_plan(const Graph& g, const TensorParallelPlan& plan);

// A group that only knows its place: for planning and estimates, where no op runs
// (an all-reduce through it is an internal error).
std::shared_ptr<TensorGroup> placeholder_group(int rank, int size);

}  // namespace dtrain::graph
