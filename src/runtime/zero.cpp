// See zero.h.
#include "runtime/zero.h"

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

}  // namespace dtrain::runtime
