// Tensor parallelism as the ops see it (Megatron's split, applied to a single-device
// graph from outside by graph/tensor_parallel.h): the group an op's collectives go
// through, the part of a layer one rank computes, and how a parameter is cut.
// The graph cannot reach a communicator (dist sits beside it); the runtime backs
// TensorGroup with the process grid's tensor communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "core/tensor.h"

namespace dtrain::graph {

enum class GroupReduce : uint8_t { sum, max };

// The tensor-parallel group. Every rank of it runs the same graph, so the ops' calls
// meet in the same order everywhere.
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over the group, any floating dtype; every rank gets the same bits.
  virtual void all_reduce(Tensor& t, GroupReduce op) = 0;
};

// Items [first, first + count) of `total` for rank r of n: as even as can be, the
// first total % n ranks one more (a vocabulary need not divide).
std::pair<int64_t, int64_t> share_of(int64_t total, int rank, int size);

// The part of one layer a rank computes.
//  column: a linear's output features (and its bias) split; backward all-reduces the
//          input gradient (Megatron's f: identity forward, all-reduce backward).
//  row:    a linear's input features split; forward all-reduces the output before
//          the bias (g: all-reduce forward, identity backward).
//  heads:  an attention's heads split.
//  vocab:  an embedding's table rows, or the cross-entropy's classes, split.
// begin / count / total count features (of each chunk), heads or vocabulary rows.
enum class TpRole : uint8_t { column, row, heads, vocab };
struct TpShare {
  TpRole role = TpRole::column;
  std::shared_ptr<TensorGroup> group;
  int64_t begin = 0, count = 0, total = 0;
  // column: the output features are `chunks` equal blocks (a fused q, k, v
  // projection: 3), each split alike, so a rank holds its heads of each.
  int chunks = 1;
};

// How a parameter is cut over the tensor-parallel group; dim -1: replicated (every
// rank holds all of it, and computes the same gradient for it).
struct ParamSplit {
  int dim = -1;
  int64_t total = 0;  // the whole tensor's extent along dim
  int64_t begin = 0;  // this rank's first index along dim, within each chunk
  int chunks = 1;     // dim holds `chunks` equal blocks, each cut alike
  bool split() const { return dim >= 0; }
  bool operator==(const ParamSplit&) const = default;
};

}  // namespace dtrain::graph
