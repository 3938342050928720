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

void broadcast_shards(dist::Communicator& comm, const Tensor& mine, const ShardRange& me,
                      int64_t piece,
                      const std::function<void(int64_t lo, const Tensor& values)>& take) {
  const int world = comm.size();
  DTRAIN_CHECK(world == me.world && mine.numel() == me.size(), "a shard of {} for [{}, {}) of {}",
               mine.numel(), me.begin, me.end, me.world);
  const int64_t span = me.span;
  piece = std::max<int64_t>(1, std::min(piece, span / world + span % world + 1));
  // On the communicator's device (`mine` may be in host memory: ZeRO-Offload).
  Tensor buf = Tensor::empty(Shape{piece}, DType::f32, &kernels::device_allocator(comm.device()));
  for (int r = 0; r < world; ++r) {
    const ShardRange s = shard_of(span, r, world, me.base);
    for (int64_t lo = s.begin; lo < s.end; lo += piece) {
      const int64_t n = std::min(piece, s.end - lo);
      Tensor values = buf.view(0, Shape{n});
      if (r == comm.rank()) kernels::copy(mine.view(lo - s.begin, Shape{n}), values);
      comm.broadcast(values, r);
      take(lo, values);
    }
  }
}

}  // namespace dtrain::runtime
