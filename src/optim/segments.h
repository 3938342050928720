// Parameter segments: the named tensors of ONE flat f32 parameter buffer (and of the
// gradient and optimizer-state buffers, which share its layout), each with its weight
// decay mode. The runtime builds them from graph::FlatStore entries; optim never sees
// the graph. Also the shard slicing ZeRO uses and the fixed chunk table the loops run on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optim/options.h"

namespace dtrain::optim {

enum class DecayMode : uint8_t { decay, no_decay };

struct ParamSegment {
  std::string name;    // "layer1.0.conv1.weight"
  int64_t offset = 0;  // elements into the flat buffer
  int64_t size = 0;    // elements
  DecayMode decay = DecayMode::decay;
  double lr_scale = 1.0;  // the learning rate's factor (optimizer.layer_decay, .groups)
  // optimizer.freeze: the gradient arrives zeroed; every optimizer passes the segment
  // over (parameters unchanged, no state: Optimizer::load_state), the average moves
  // toward the unchanging parameters.
  bool frozen = false;
  // optimizer.groups: the weight decay of this segment, in place of the optimizer's
  // weight_decay and the decay mode; unset: those.
  std::optional<double> weight_decay;
};

// Elements between segments (FlatStore's alignment padding) are never read or written
// by an optimizer step. Checks (DTRAIN_CHECK): sizes > 0, inside [0, total), no overlap.
void check_segments(const std::vector<ParamSegment>& segments, int64_t total_elems);

// Whether an optimizer's update of one element depends only on that element (SGD, AdamW)
// or on whole-segment norms too (LAMB's trust ratio), so a shard may not cut a segment.
enum class SegmentSplit : uint8_t { allowed, forbidden };
SegmentSplit segment_split(OptimizerName name);

// The segments a shard [begin, end) of the flat buffer holds, rebased so offset 0 is
// `begin`: an optimizer made from them steps a view of params / grads [begin, end) and
// owns state for end - begin elements only (ZeRO-1/2/3). A segment cut by a boundary
// keeps its name and becomes the part inside; with SegmentSplit::forbidden that is a
// DTRAIN_CHECK failure: the caller must place shard boundaries on segment boundaries.
std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segments, int64_t begin,
                                         int64_t end, SegmentSplit split);

// The work items of every loop: each segment cut into pieces of at most `chunk` elements,
// starting at the segment's offset. Fixed by the layout alone, never by the thread count,
// so per-chunk partial sums combined in chunk order give the same bits on any pool size.
struct SegmentChunk {
  int32_t segment = 0;
  int64_t begin = 0;  // elements into the flat buffer
  int64_t end = 0;
};
inline constexpr int64_t kChunkElems = 8192;
std::vector<SegmentChunk> chunk_segments(const std::vector<ParamSegment>& segments,
                                         int64_t chunk = kChunkElems);

}  // namespace dtrain::optim
