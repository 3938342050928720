// ZeRO's shards of the flat fp32 layout (the gradients', the masters' and the
// optimizer state's, which is one layout): rank r of W owns the elements
// [r * block, (r + 1) * block), block = total / W rounded down, and the last rank also
// the tail [W * block, total). Equal blocks let one all-gather (and, for stage 2, one
// reduce-scatter) serve every rank; the tail of fewer than W elements travels by
// broadcast. A shard may cut a parameter tensor: SGD and AdamW update each element
// alone, so a shard steps exactly the elements it owns (optim::shard_segments).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"

namespace dtrain::runtime {

struct ShardRange {
  int64_t begin = 0, end = 0;  // this rank's elements
  int64_t block = 0;           // every rank's equal part (the last rank adds the tail)
  int world = 1;               // 1: not sharded, [0, total)
  // The span the world divides: [base, base + span) of the layout; the whole layout
  // unless `staged`: a pipeline stage's parameters (runtime/pipeline.h, stage_spans),
  // the rest of the layout being the other stages' (neither stepped nor saved here).
  int64_t base = 0, span = 0;
  bool staged = false;
  int64_t size() const { return end - begin; }
  bool sharded() const { return world > 1; }
  // This rank steps part of the layout only (ZeRO, a pipeline stage, or both).
  bool ranged() const { return sharded() || staged; }
};

// Rank `rank` of `world`'s part of [base, base + span).
ShardRange shard_of(int64_t span, int rank, int world, int64_t base = 0);

// `flat` (the whole layout) holds this rank's range correct on each rank: afterwards
// every rank holds all of mine's span (an all-gather of the equal blocks and a
// broadcast of the tail).
void gather_shards(dist::Communicator& comm, Tensor flat, const ShardRange& mine);

// Intervals [lo, hi) of the layout, increasing and disjoint.
using LayoutRanges = std::vector<std::pair<int64_t, int64_t>>;

// With optimizer.freeze a step changes only part of the span, `cover` (the gradient
// buckets' ranges, runtime::bucket_cover): gather_shards of that part alone, the rest
// of the span left as it is (equal on every rank). A cover of at most
// kInPlaceCoverParts parts travels in place, one all_gatherv per part (no buffer);
// a longer one (BitFit's biases between frozen weights) in rounds of one all_gatherv
// of every rank's parts packed into a buffer of gather_cover_elems elements (at most
// `piece`), so that the collectives stay few.
inline constexpr size_t kInPlaceCoverParts = 16;
void gather_cover(dist::Communicator& comm, Tensor flat, const ShardRange& mine,
                  const LayoutRanges& cover, int64_t piece);
// The elements of gather_cover's buffer (0: nothing to gather), for dtrain estimate.
int64_t gather_cover_elems(const ShardRange& mine, const LayoutRanges& cover, int64_t piece);

// Every rank's range of an f32-layout vector of `total` elements, from its owner, in
// pieces of at most `piece` elements: `take(lo, values)` runs on every rank for each
// piece in layout order (`values` on this rank's device, valid during the call). For
// ZeRO-2, whose ranks hold no whole f32 buffer to gather into. `mine`: f32 [this
// rank's size], `me` its range (the span it divides is what travels; with a `cover`,
// only the parts of it within the cover).
void broadcast_shards(dist::Communicator& comm, const Tensor& mine, const ShardRange& me,
                      int64_t piece,
                      const std::function<void(int64_t lo, const Tensor& values)>& take,
                      const LayoutRanges* cover = nullptr);
// The elements of broadcast_shards' buffer, for dtrain estimate.
int64_t broadcast_shards_elems(const ShardRange& me, int64_t piece,
                               const LayoutRanges* cover = nullptr);

}  // namespace dtrain::runtime
