// Segment checks, shard slicing and the chunk table (see segments.h). Nothing here
// touches tensor data.
#include "optim/segments.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace dtrain::optim {

void check_segments(const std::vector<ParamSegment>& segments, int64_t total_elems) {
  std::vector<size_t> order(segments.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return segments[a].offset < segments[b].offset; });
  int64_t covered = 0;  // end of the previous segment in offset order
  for (size_t i : order) {
    const ParamSegment& s = segments[i];
    DTRAIN_CHECK(s.size > 0 && s.offset >= 0 && s.offset + s.size <= total_elems,
                 "segment {} [{}, +{}) is empty or outside the flat buffer of {} elements", s.name,
                 s.offset, s.size, total_elems);
    DTRAIN_CHECK(s.offset >= covered, "segment {} at {} overlaps the segment ending at {}", s.name,
                 s.offset, covered);
    covered = s.offset + s.size;
  }
}

SegmentSplit segment_split(OptimizerName name) {
  return name == OptimizerName::lamb ? SegmentSplit::forbidden : SegmentSplit::allowed;
}

std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segments, int64_t begin,
                                         int64_t end, SegmentSplit split) {
  DTRAIN_CHECK(0 <= begin && begin <= end, "shard [{}, {}) is not a range", begin, end);
  std::vector<ParamSegment> out;
  for (const ParamSegment& s : segments) {
    const int64_t lo = std::max(begin, s.offset);
    const int64_t hi = std::min(end, s.offset + s.size);
    if (lo >= hi) continue;
    DTRAIN_CHECK(split == SegmentSplit::allowed || (lo == s.offset && hi == s.offset + s.size),
                 "shard [{}, {}) cuts segment {} [{}, +{}); this optimizer needs whole "
                 "segments per shard",
                 begin, end, s.name, s.offset, s.size);
    ParamSegment piece = s;  // every setting of the segment, for its part inside
    piece.offset = lo - begin;
    piece.size = hi - lo;
    out.push_back(std::move(piece));
  }
  return out;
}

std::vector<SegmentChunk> chunk_segments(const std::vector<ParamSegment>& segments, int64_t chunk) {
  DTRAIN_CHECK(chunk > 0, "chunk of {} elements", chunk);
  std::vector<SegmentChunk> out;
  for (size_t i = 0; i < segments.size(); ++i) {
    const int64_t end = segments[i].offset + segments[i].size;
    for (int64_t lo = segments[i].offset; lo < end; lo += chunk)
      out.push_back({static_cast<int32_t>(i), lo, std::min(end, lo + chunk)});
  }
  return out;
}

}  // namespace dtrain::optim
