// Sampler: per-epoch permutations from (seed, epoch), sharding by (rank, world),
// drop_last / pad tails, and resuming at a position.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/error.h"
#include "data/sampler.h"

using namespace dtrain;

namespace {

std::vector<int64_t> order(int64_t n, uint64_t seed, int64_t epoch, Shuffle s = Shuffle::on) {
  std::vector<int64_t> out;
  epoch_order(n, seed, epoch, s, out);
  return out;
}

// `count` batches of one rank, flattened.
std::vector<int64_t> stream(const SamplerConfig& c, int count, DataPosition start = {}) {
  Sampler s(c, start);
  std::vector<int64_t> out(static_cast<size_t>(c.batch * count));
  for (int b = 0; b < count; ++b) s.next(out.data() + b * c.batch);
  return out;
}

}  // namespace

TEST_CASE("an epoch's order is a permutation, per seed and epoch") {
  const auto a = order(1000, 7, 0);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) CHECK(sorted[static_cast<size_t>(i)] == i);
  CHECK(a == order(1000, 7, 0));
  CHECK(a != order(1000, 7, 1));
  CHECK(a != order(1000, 8, 0));
  CHECK(order(1000, 7, 1) != order(1000, 7, 2));
  // Shuffled means shuffled: few elements stay in place (a fixed-point count near 1).
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += a[static_cast<size_t>(i)] == i;
  CHECK(fixed < 10);
  const auto id = order(50, 7, 3, Shuffle::off);
  for (int64_t i = 0; i < 50; ++i) CHECK(id[static_cast<size_t>(i)] == i);
  CHECK(order(1, 7, 0) == std::vector<int64_t>{0});
}

TEST_CASE("shards are disjoint and cover the epoch (world 2 and 3)") {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    SamplerConfig c;
    c.dataset_size = 120;
    c.batch = 5;
    c.world = world;
    c.seed = 11;
    std::multiset<int64_t> seen;
    const int per_epoch = static_cast<int>(120 / (5 * world));
    for (int r = 0; r < world; ++r) {
      c.rank = r;
      for (int64_t i : stream(c, per_epoch)) seen.insert(i);
    }
    CHECK(seen.size() == 120);
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 120);
    // Global batch k is the contiguous run [k*G, (k+1)*G) of the epoch's order.
    const auto o = order(120, 11, 0);
    c.rank = world - 1;
    const auto last = stream(c, 1);
    for (int j = 0; j < 5; ++j)
      CHECK(last[static_cast<size_t>(j)] == o[static_cast<size_t>((world - 1) * 5 + j)]);
  }
}

TEST_CASE("drop_last drops the partial global batch, pad wraps to the epoch start") {
  SamplerConfig c;
  c.dataset_size = 23;
  c.batch = 4;
  c.world = 2;
  c.seed = 3;
  Sampler drop(c);
  CHECK(drop.batches_per_epoch() == 2);
  std::vector<int64_t> idx(4);
  drop.next(idx.data());
  const BatchInfo second = drop.next(idx.data());
  CHECK(second.next == DataPosition{1, 0});
  CHECK(drop.next(idx.data()).epoch == 1);

  c.tail = Tail::pad;
  c.rank = 1;
  Sampler pad(c);
  CHECK(pad.batches_per_epoch() == 3);
  pad.next(idx.data());
  pad.next(idx.data());
  // Offset 16, rank 1: positions 20, 21, 22 are real, 23 wraps to position 0.
  const BatchInfo tail = pad.next(idx.data());
  const auto o = order(23, 3, 0);
  CHECK(tail.epoch == 0);
  CHECK(tail.valid == 3);
  CHECK(idx[2] == o[22]);
  CHECK(idx[3] == o[0]);
  CHECK(tail.next == DataPosition{1, 0});
  c.rank = 0;
  c.tail = Tail::drop;
  c.dataset_size = 7;
  CHECK_THROWS_AS(Sampler{c}, Error);
}

TEST_CASE("a sampler built at a position yields exactly the uninterrupted stream") {
  SamplerConfig c;
  c.dataset_size = 50;
  c.batch = 3;
  c.world = 2;
  c.rank = 1;
  c.seed = 99;
  for (const Tail tail : {Tail::drop, Tail::pad}) {
    c.tail = tail;
    const auto full = stream(c, 40);  // crosses several epochs
    Sampler s(c);
    std::vector<int64_t> idx(3);
    for (int b = 0; b < 40; ++b) {
      const DataPosition at = s.position();
      CHECK(stream(c, 40 - b, at) == std::vector<int64_t>(full.begin() + 3 * b, full.end()));
      s.next(idx.data());
    }
  }
}

// A step of 2 micro-batches on 1 rank takes the samples 2 ranks take in one batch each,
// epoch tail included: the step is dropped (or padded) whole, not cut between
// micro-batches. 30 samples, steps of 8: 3 steps an epoch with drop_last (6 left over,
// more than a micro-batch of 4), 4 with the tail padded by wrapping.
TEST_CASE("a step's micro-batches keep or drop the epoch's tail as the ranks' batches do") {
  for (const Tail tail : {Tail::drop, Tail::pad}) {
    CAPTURE(static_cast<int>(tail));
    SamplerConfig one;
    one.dataset_size = 30;
    one.batch = 4;
    one.micro_steps = 2;
    one.seed = 11;
    one.tail = tail;
    SamplerConfig two = one;
    two.world = 2;
    two.micro_steps = 1;
    const int steps = tail == Tail::drop ? 3 : 4;
    CHECK(Sampler(one).batches_per_epoch() == 2 * steps);
    CHECK(Sampler(two).batches_per_epoch() == steps);
    const int count = 3 * steps;  // three epochs
    const std::vector<int64_t> micro = stream(one, 2 * count);
    std::vector<int64_t> ranks;
    SamplerConfig second = two;
    second.rank = 1;
    Sampler r0(two), r1(second);
    std::vector<int64_t> b(4);
    for (int k = 0; k < count; ++k) {
      r0.next(b.data());
      ranks.insert(ranks.end(), b.begin(), b.end());
      r1.next(b.data());
      ranks.insert(ranks.end(), b.begin(), b.end());
    }
    CHECK(micro == ranks);
    // Without micro-steps, 1 rank's batches of 4 cut the epoch elsewhere (7 batches).
    SamplerConfig plain = one;
    plain.micro_steps = 1;
    if (tail == Tail::drop) CHECK(stream(plain, 2 * count) != micro);
  }
  SamplerConfig few;
  few.dataset_size = 12;
  few.batch = 4;
  few.micro_steps = 4;
  CHECK_THROWS_WITH_AS(Sampler{few},
                       doctest::Contains("global batch of 16 (4 per rank x 1 ranks x 4 "
                                         "micro-batches)"),
                       Error);
}
