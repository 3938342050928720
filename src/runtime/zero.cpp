// See zero.h.
#include "runtime/zero.h"

#include <algorithm>

#include "kernels/memory.h"

namespace dtrain::runtime {

ShardRange shard_of(int64_t span, int rank, int world, int64_t base) {
  DTRAIN_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} of {}", rank, world);
  ShardRange s;
  s.world = world;
  s.base = base;
  s.span = span;
  s.block = span / world;
  s.begin = base + rank * s.block;
  s.end = rank + 1 == world ? base + span : s.begin + s.block;
  return s;
}

void gather_shards(dist::Communicator& comm, Tensor flat, const ShardRange& mine) {
  if (!mine.sharded()) return;
  DTRAIN_CHECK(comm.size() == mine.world, "a shard of {} ranks gathered over {}", mine.world,
               comm.size());
  DTRAIN_CHECK(mine.base + mine.span <= flat.numel(), "a span [{}, {}) of {} elements", mine.base,
               mine.base + mine.span, flat.numel());
  const int64_t blocks = mine.block * mine.world;
  if (mine.block > 0) {  // in place: no send buffer
    const Tensor own = flat.view(mine.begin, Shape{mine.block});
    Tensor all = flat.view(mine.base, Shape{blocks});
    comm.all_gather(own, all);
  }
  if (mine.span > blocks) {
    Tensor tail = flat.view(mine.base + blocks, Shape{mine.span - blocks});
    comm.broadcast(tail, mine.world - 1);
  }
}

namespace {

// The parts of `cover` within [lo, hi); the whole of it without a cover.
LayoutRanges clip(const LayoutRanges* cover, int64_t lo, int64_t hi) {
  if (cover == nullptr) return lo < hi ? LayoutRanges{{lo, hi}} : LayoutRanges{};
  LayoutRanges parts;
  for (const auto& [a, b] : *cover) {
    const int64_t x = std::max(a, lo), y = std::min(b, hi);
    if (x < y) parts.emplace_back(x, y);
  }
  return parts;
}

int64_t elems(const LayoutRanges& parts) {
  int64_t n = 0;
  for (const auto& [a, b] : parts) n += b - a;
  return n;
}

// fn(at, lo, n) for the pieces of `parts` (read end to end) at positions [from, from + count):
// `at` relative to from, `lo` the layout offset.
void walk(const LayoutRanges& parts, int64_t from, int64_t count,
          const std::function<void(int64_t at, int64_t lo, int64_t n)>& fn) {
  int64_t pos = 0;  // position of the current part's start
  for (const auto& [a, b] : parts) {
    const int64_t len = b - a;
    const int64_t x = std::max(from, pos), y = std::min(from + count, pos + len);
    if (x < y) fn(x - from, a + (x - pos), y - x);
    pos += len;
    if (pos >= from + count) return;
  }
}

// Every rank's parts of the cover within its range.
std::vector<LayoutRanges> rank_parts(const ShardRange& mine, const LayoutRanges* cover) {
  std::vector<LayoutRanges> parts;
  for (int r = 0; r < mine.world; ++r) {
    const ShardRange s = shard_of(mine.span, r, mine.world, mine.base);
    parts.push_back(clip(cover, s.begin, s.end));
  }
  return parts;
}

// The most elements any rank's parts hold.
int64_t most_of(const std::vector<LayoutRanges>& parts) {
  int64_t most = 0;
  for (const LayoutRanges& p : parts) most = std::max(most, elems(p));
  return most;
}

}  // namespace

int64_t gather_cover_elems(const ShardRange& mine, const LayoutRanges& cover, int64_t piece) {
  if (!mine.sharded() || cover.size() <= kInPlaceCoverParts) return 0;  // in place
  const int64_t most = most_of(rank_parts(mine, &cover));
  if (most == 0) return 0;
  return std::max<int64_t>(1, std::min(piece / mine.world, most)) * mine.world;
}

void gather_cover(dist::Communicator& comm, Tensor flat, const ShardRange& mine,
                  const LayoutRanges& cover, int64_t piece) {
  if (!mine.sharded()) return;
  const int world = comm.size(), me = comm.rank();
  DTRAIN_CHECK(world == mine.world, "a shard of {} ranks gathered over {}", mine.world, world);
  if (cover.size() <= kInPlaceCoverParts) {
    // Each part of the cover, in place: its pieces in the ranks' ranges lie end to end
    // in rank order (the ranges tile the span), as an all_gatherv wants them.
    for (const auto& [a, b] : cover) {
      const int64_t lo = std::max(a, mine.base), hi = std::min(b, mine.base + mine.span);
      if (lo >= hi) continue;
      std::vector<int64_t> counts(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        const ShardRange s = shard_of(mine.span, r, world, mine.base);
        counts[static_cast<size_t>(r)] =
            std::max<int64_t>(0, std::min(hi, s.end) - std::max(lo, s.begin));
      }
      comm.all_gatherv_async(flat.view(lo, Shape{hi - lo}), counts).wait();
    }
    return;
  }
  const std::vector<LayoutRanges> parts = rank_parts(mine, &cover);
  const int64_t most = most_of(parts);
  if (most == 0) return;
  const int64_t q = gather_cover_elems(mine, cover, piece) / world;
  Tensor buf =
      Tensor::empty(Shape{q * world}, flat.dtype(), &kernels::device_allocator(flat.device()));
  for (int64_t from = 0; from < most; from += q) {  // every rank: the same rounds
    std::vector<int64_t> counts(static_cast<size_t>(world)), at(static_cast<size_t>(world));
    int64_t sum = 0;
    for (int r = 0; r < world; ++r) {
      const auto k = static_cast<size_t>(r);
      counts[k] = std::clamp<int64_t>(elems(parts[k]) - from, 0, q);
      at[k] = sum;
      sum += counts[k];
    }
    const auto mk = static_cast<size_t>(me);
    walk(parts[mk], from, counts[mk], [&](int64_t off, int64_t lo, int64_t n) {
      Tensor dst = buf.view(at[mk] + off, Shape{n});
      kernels::copy(flat.view(lo, Shape{n}), dst);
    });
    comm.all_gatherv_async(buf.view(0, Shape{sum}), counts).wait();
    for (int r = 0; r < world; ++r) {
      if (r == me) continue;
      const auto k = static_cast<size_t>(r);
      walk(parts[k], from, counts[k], [&](int64_t off, int64_t lo, int64_t n) {
        Tensor dst = flat.view(lo, Shape{n});
        kernels::copy(buf.view(at[k] + off, Shape{n}), dst);
      });
    }
  }
}

int64_t broadcast_shards_elems(const ShardRange& me, int64_t piece, const LayoutRanges* cover) {
  const std::vector<LayoutRanges> parts = rank_parts(me, cover);
  int64_t longest = 0;
  for (const LayoutRanges& p : parts)
    for (const auto& [a, b] : p) longest = std::max(longest, b - a);
  return std::max<int64_t>(1, std::min(piece, longest));
}

void broadcast_shards(dist::Communicator& comm, const Tensor& mine, const ShardRange& me,
                      int64_t piece,
                      const std::function<void(int64_t lo, const Tensor& values)>& take,
                      const LayoutRanges* cover) {
  const int world = comm.size();
  DTRAIN_CHECK(world == me.world && mine.numel() == me.size(), "a shard of {} for [{}, {}) of {}",
               mine.numel(), me.begin, me.end, me.world);
  const std::vector<LayoutRanges> parts = rank_parts(me, cover);
  piece = broadcast_shards_elems(me, piece, cover);
  // On the communicator's device (`mine` may be in host memory: ZeRO-Offload).
  Tensor buf = Tensor::empty(Shape{piece}, DType::f32, &kernels::device_allocator(comm.device()));
  for (int r = 0; r < world; ++r) {
    const int64_t begin = shard_of(me.span, r, world, me.base).begin;
    for (const auto& [a, b] : parts[static_cast<size_t>(r)]) {
      for (int64_t lo = a; lo < b; lo += piece) {
        const int64_t n = std::min(piece, b - lo);
        Tensor values = buf.view(0, Shape{n});
        if (r == comm.rank()) kernels::copy(mine.view(lo - begin, Shape{n}), values);
        comm.broadcast(values, r);
        take(lo, values);
      }
    }
  }
}

}  // namespace dtrain::runtime
