// See zero.h.
#include "runtime/zero.h"

#include <algorithm>

#include "kernels/memory.h"

namespace dtrain::runtime {

ShardRange shard_of(int64_t total, int rank, int world) {
  DTRAIN_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} of {}", rank, world);
  ShardRange s;
  s.world = world;
  s.block = total / world;
  s.begin = rank * s.block;
  s.end = rank + 1 == world ? total : s.begin + s.block;
  return s;
}

void gather_shards(dist::Communicator& comm, Tensor flat, const ShardRange& mine) {
  if (!mine.sharded()) return;
  DTRAIN_CHECK(comm.size() == mine.world, "a shard of {} ranks gathered over {}", mine.world,
               comm.size());
  const int64_t total = flat.numel();
  const int64_t blocks = mine.block * mine.world;
  if (mine.block > 0) {  // in place: no send buffer
    const Tensor own = flat.view(mine.begin, Shape{mine.block});
    Tensor all = flat.view(0, Shape{blocks});
    comm.all_gather(own, all);
  }
  if (total > blocks) {
    Tensor tail = flat.view(blocks, Shape{total - blocks});
    comm.broadcast(tail, mine.world - 1);
  }
}

void broadcast_shards(dist::Communicator& comm, const Tensor& mine, int64_t total, int64_t piece,
                      const std::function<void(int64_t lo, const Tensor& values)>& take) {
  const int world = comm.size();
  const ShardRange me = shard_of(total, comm.rank(), world);
  DTRAIN_CHECK(mine.numel() == me.size(), "a shard of {} for [{}, {})", mine.numel(), me.begin,
               me.end);
  piece = std::max<int64_t>(1, std::min(piece, total / world + total % world + 1));
  // On the communicator's device (`mine` may be in host memory: ZeRO-Offload).
  Tensor buf = Tensor::empty(Shape{piece}, DType::f32, &kernels::device_allocator(comm.device()));
  for (int r = 0; r < world; ++r) {
    const ShardRange s = shard_of(total, r, world);
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
