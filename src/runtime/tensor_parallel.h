// Tensor parallelism in the trainer (graph/tensor_parallel.h splits the graph): the
// ops' group over the grid's tensor communicator, and the moves between this rank's
// split layout and the one-rank model's whole layout that checkpoints, the gradient
// norm and evaluation need. Both layouts list the same parameters in the same order
// (the pass keeps nodes and names); a split entry maps element by element through
// graph::whole_index.
#pragma once

#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "graph/params.h"
#include "graph/tensor_parallel.h"
#include "optim/optimizer.h"
#include "runtime/zero.h"

namespace dtrain::runtime {

// The TensorGroup the split ops hold: its place is known when the graph is split
// (before start-up is agreed), its communicator attached afterwards (a collective
// before then is an internal error). Half tensors are summed in f32 (MPI moves no
// halves) and rounded once, as the one-rank GEMM rounds its f32 sum.
class CommTensorGroup final : public graph::TensorGroup {
 public:
  CommTensorGroup(int rank, int size) : rank_(rank), size_(size) {}
  void attach(dist::Communicator& comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(Tensor& t, graph::GroupReduce op) override;

 private:
  int rank_, size_;
  dist::Communicator* comm_ = nullptr;
};

// The fp32 layout (MasterWeights') of a graph before the split: the one-rank model's.
std::vector<graph::FlatEntry> whole_f32_layout(const graph::Graph& g);

// Adds this rank's parts of `local` (f32: elements [base, base + local.numel()) of
// `local_layout`, the whole of it at base 0) into `out`, the whole layout's range
// [lo, lo + out.numel()) (f32, host, filled with -0 by the caller: x + -0 is x, for a
// -0 too), replicated entries only when `replicated` is set (one rank of the group):
// summed over the tensor group (and over the data group when each data rank holds a
// shard of the local layout), every element then comes from exactly one rank, exactly.
void add_local_to_whole_range(const Tensor& local,
                              const std::vector<graph::FlatEntry>& local_layout,
                              const std::vector<graph::FlatEntry>& whole_layout, bool replicated,
                              int64_t lo, Tensor& out, int64_t base = 0);
// This rank's parts of the whole layout's range [lo, lo + piece.numel()) into `local`
// (f32, host: elements [base, base + local.numel()) of `local_layout`, so a rank that
// steps a range of it holds only that; elements outside the range untouched).
void whole_range_to_local(const Tensor& piece, int64_t lo,
                          const std::vector<graph::FlatEntry>& whole_layout,
                          const std::vector<graph::FlatEntry>& local_layout, Tensor& local,
                          int64_t base = 0);

// Collective over `tensor` (a checkpoint save written by shard): the whole layout's span
// [base, base + span) split among the tensor ranks (runtime/zero.h's shard_of), each
// range assembled on its owner from every tensor rank's parts of `state` (parameters,
// buffers (not read), optimizer buffers: f32, elements [local_base, local_base + n) of
// the local layout) into a range-sized buffer reduced into each owner in turn: never
// the whole model, nor this rank's whole local layout. `data` (collective over it too):
// the data group when each of its ranks holds a shard of the local layout (ZeRO); the
// shards' parts are reduced into its rank 0 first, which alone gets a range. The owner
// gets its range's parameters and an optimizer for the range holding that range of the
// state (`segments`: the whole layout's; `step`: its step count).
struct WholeRange {
  ShardRange range;
  Tensor params;  // f32 [range.size()], host; undefined off data rank 0
  std::unique_ptr<optim::Optimizer> opt;
};
struct RangeAssembly {
  const std::vector<graph::FlatEntry>* local_layout = nullptr;
  const std::vector<graph::FlatEntry>* whole_layout = nullptr;
  bool replicated = false;  // this rank adds the replicated entries (one per tensor group)
  int64_t local_base = 0;   // where `state`'s tensors start in the local layout
  int64_t base = 0, span = 0;
  OptimizerOptions options;
  std::vector<optim::ParamSegment> segments;
  int64_t step = 0;
};
WholeRange assemble_range(dist::Communicator& tensor, dist::Communicator* data,
                          const std::vector<Tensor>& state, const RangeAssembly& a);

// Per replicated entry of `layout` and per tensor of `tensors` (f32, elements
// [base, base + n) of the layout), an order-free digest of the elements held: the sum
// of a 32-bit mix of (the element's index in its entry, its bits) in 64-bit integers.
// Parts of an entry held by different ranks (ZeRO shards) add up to the whole entry's
// digest exactly, in any order: summed over a data group, equal digests on every
// tensor rank say the replicated state agrees.
std::vector<int64_t> replicated_digests(const std::vector<Tensor>& tensors,
                                        const std::vector<graph::FlatEntry>& layout, int64_t base);

// Sum of squares of `grads` (f32 flat, `layout`) over the split entries, and over the
// replicated ones too when `replicated` is set: summed over the tensor group (with
// `replicated` on one rank only) it is the whole gradient's.
// `grads` may be a range of the flat buffer starting at element `base` (a ZeRO shard):
// entries count for their part inside it.
double tensor_sum_squares(const Tensor& grads, const std::vector<graph::FlatEntry>& layout,
                          bool replicated, int64_t base = 0);

// Top-1 over vocabulary-split logits: for each row of `logits` (f32 [rows, count],
// classes [begin, begin + count) of the whole), the whole row's first argmax, agreed
// over `group` (two all-reduces). Collective.
std::vector<int64_t> split_argmax(const Tensor& logits, int64_t begin, graph::TensorGroup& group);

}  // namespace dtrain::runtime
