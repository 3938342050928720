// ZeRO's gathers with optimizer.freeze (runtime/zero.h) on 2-4 ranks: gather_cover and
// broadcast_shards with a cover move exactly the covered parts of every rank's range
// (holes, a cover part cut by a shard boundary, a rank whose range the cover misses; in
// place part by part, or for a cover of many parts in rounds through a small buffer)
// and leave every other element as it was; both match gather_shards where the cover is
// the whole span, and count the cover's bytes.
#include <doctest/doctest.h>

#include <vector>

#include "mpi_world.h"
#include "runtime/zero.h"

using namespace dtrain;
using namespace dtrain::runtime;

namespace {

// Element i as rank r steps it (a stale copy holds -1 - i).
float value(int rank, int64_t i) { return static_cast<float>(rank * 100000 + i); }

// `flat` as rank `me` holds it before a gather: its own range stepped, the rest stale.
std::vector<float> before(const ShardRange& me, int64_t total, int rank) {
  std::vector<float> v(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i)
    v[static_cast<size_t>(i)] = i >= me.begin && i < me.end ? value(rank, i) : -1.0f - i;
  return v;
}

bool covered(const LayoutRanges& cover, int64_t i) {
  for (const auto& [a, b] : cover)
    if (i >= a && i < b) return true;
  return false;
}

int owner(int64_t span, int world, int64_t base, int64_t i) {
  for (int r = 0; r < world; ++r) {
    const ShardRange s = shard_of(span, r, world, base);
    if (i >= s.begin && i < s.end) return r;
  }
  return -1;
}

}  // namespace

TEST_CASE("gather_cover and broadcast_shards move the cover alone, in rounds") {
  dist::Communicator& comm = test_world();
  const int world = comm.size(), me = comm.rank();
  const int64_t total = 103, base = 3, span = 97;  // a span with a tail, inside the layout
  const ShardRange mine = shard_of(span, me, world, base);
  // Holes inside ranges, a part crossing rank boundaries, nothing in the last block's start.
  std::vector<LayoutRanges> covers = {
      {{5, 9}, {20, 61}, {70, 71}, {90, 100}}, {{base, base + span}}, {{40, 41}}, {}};
  LayoutRanges many;  // more parts than go in place: packed rounds through a buffer
  for (int64_t a = 4; a + 2 <= base + span; a += 4) many.emplace_back(a, a + 2);
  REQUIRE(many.size() > kInPlaceCoverParts);
  covers.push_back(many);
  for (const LayoutRanges& cover : covers) {
    CAPTURE(cover.size());
    for (int64_t piece : {int64_t{2}, int64_t{7}, int64_t{1000}}) {
      CAPTURE(piece);
      std::vector<float> v = before(mine, total, me);
      Tensor flat = Tensor::wrap(v.data(), Shape{total}, DType::f32);
      const dist::CommStats s0 = comm.stats();
      gather_cover(comm, flat, mine, cover, piece);
      const double bus = comm.stats().bus_bytes - s0.bus_bytes;
      int64_t n = 0;
      for (const auto& [a, b] : cover) n += b - a;
      CHECK(bus == doctest::Approx(static_cast<double>(n) * 4 * (world - 1) / world));
      const int64_t buffer = gather_cover_elems(mine, cover, piece);
      if (cover.size() <= kInPlaceCoverParts) {
        CHECK(buffer == 0);  // in place, a part at a time
      } else {
        CHECK(buffer > 0);
        CHECK(buffer <= std::max<int64_t>(piece, world));
      }
      std::vector<float> got(static_cast<size_t>(total));
      int64_t moved = 0;
      for (int64_t i = 0; i < total; ++i) {
        const int o = owner(span, world, base, i);
        const bool own = i >= mine.begin && i < mine.end;
        const float want = own || (o >= 0 && covered(cover, i)) ? value(o, i) : -1.0f - i;
        if (v[static_cast<size_t>(i)] != want) ++moved;
      }
      CHECK(moved == 0);
      // broadcast_shards: every covered piece once, in layout order per owner, on every rank.
      std::vector<float> owned(static_cast<size_t>(mine.size()));
      for (int64_t i = mine.begin; i < mine.end; ++i)
        owned[static_cast<size_t>(i - mine.begin)] = value(me, i);
      const Tensor shard = Tensor::wrap(owned.data(), Shape{mine.size()}, DType::f32);
      std::vector<int> seen(static_cast<size_t>(total), 0);
      bool right = true;
      broadcast_shards(
          comm, shard, mine, piece,
          [&](int64_t lo, const Tensor& values) {
            for (int64_t k = 0; k < values.numel(); ++k) {
              ++seen[static_cast<size_t>(lo + k)];
              right = right &&
                      values.data<float>()[k] == value(owner(span, world, base, lo + k), lo + k);
            }
            CHECK(values.numel() <= broadcast_shards_elems(mine, piece, &cover));
          },
          &cover);
      CHECK(right);
      for (int64_t i = 0; i < total; ++i)
        CHECK(seen[static_cast<size_t>(i)] == (covered(cover, i) && i >= base ? 1 : 0));
    }
  }
  // The whole span as the cover: gather_shards' bits.
  std::vector<float> a = before(mine, total, me), b = a;
  Tensor ta = Tensor::wrap(a.data(), Shape{total}, DType::f32);
  Tensor tb = Tensor::wrap(b.data(), Shape{total}, DType::f32);
  gather_shards(comm, ta, mine);
  gather_cover(comm, tb, mine, {{base, base + span}}, 5);
  CHECK(a == b);
}
