// BlockPool (the device caching allocator's bookkeeping) against a fake
// upstream that hands out addresses without memory behind them and whose
// events complete when the test says so: size classes, segment policy,
// reuse, stream awareness, coalescing, statistics and out-of-memory.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "core/block_pool.h"
#include "core/error.h"

using namespace dtrain;

namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;

class FakeSource final : public SegmentSource {
 public:
  explicit FakeSource(size_t capacity) : capacity_(capacity) {}

  void* allocate_segment(size_t bytes) override {
    if (in_use_ + bytes > capacity_) return nullptr;
    in_use_ += bytes;
    next_ += bytes + 4096;  // distinct, never adjacent, never dereferenced
    segments_[next_] = bytes;
    ++allocs;
    return reinterpret_cast<void*>(next_);
  }
  void free_segment(void* ptr, size_t bytes) override {
    auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
    REQUIRE(it != segments_.end());
    REQUIRE(it->second == bytes);
    in_use_ -= bytes;
    segments_.erase(it);
    ++frees;
  }
  uint64_t record_event(StreamId stream) override {
    recorded.push_back(stream);
    return ++last_event;
  }
  bool event_done(uint64_t event) override { return done.count(event) > 0; }
  Device device() const override { return Device::cuda(0); }
  std::string memory_info() const override { return "fake device"; }

  int allocs = 0, frees = 0;
  uint64_t last_event = 0;
  std::vector<StreamId> recorded;
  std::set<uint64_t> done;

 private:
  size_t capacity_;
  size_t in_use_ = 0;
  uintptr_t next_ = 0x100000;
  std::map<uintptr_t, size_t> segments_;
};

constexpr StreamId kS1 = 1, kS2 = 2;

}  // namespace

TEST_CASE("size classes are 512-byte multiples, never 0") {
  CHECK(BlockPool::size_class(0) == 512);
  CHECK(BlockPool::size_class(1) == 512);
  CHECK(BlockPool::size_class(512) == 512);
  CHECK(BlockPool::size_class(513) == 1024);
  CHECK(BlockPool::size_class(3 * MiB + 1) == 3 * MiB + 512);
}

TEST_CASE("segment policy: 2 MiB for small, 20 MiB for medium, own rounded segment for large") {
  CHECK(BlockPool::segment_size(512) == 2 * MiB);
  CHECK(BlockPool::segment_size(1 * MiB) == 2 * MiB);
  CHECK(BlockPool::segment_size(1 * MiB + 512) == 20 * MiB);
  CHECK(BlockPool::segment_size(10 * MiB) == 20 * MiB);
  CHECK(BlockPool::segment_size(10 * MiB + 512) == 12 * MiB);
  CHECK(BlockPool::segment_size(15 * MiB) == 16 * MiB);
}

TEST_CASE("small blocks share a segment and a freed block is reused") {
  FakeSource src(1024 * MiB);
  BlockPool pool(src);
  void* a = pool.allocate(100, kS1);
  void* b = pool.allocate(1000, kS1);
  CHECK(src.allocs == 1);
  CHECK(static_cast<char*>(b) - static_cast<char*>(a) == 512);
  MemoryStats s = pool.stats();
  CHECK(s.current == 512 + 1024);
  CHECK(s.reserved == 2 * MiB);
  CHECK(s.allocations == 2);
  CHECK(s.cache_hits == 1);  // b came from a's segment

  pool.free(a);
  CHECK(pool.stats().current == 1024);
  CHECK(pool.allocate(300, kS1) == a);  // best fit: the 512 B hole
  CHECK(pool.stats().peak == 512 + 1024);
  CHECK(src.allocs == 1);
}

TEST_CASE("a block is reused only on its own stream") {
  FakeSource src(1024 * MiB);
  BlockPool pool(src);
  void* a = pool.allocate(4 * KiB, kS1);
  pool.free(a);
  void* b = pool.allocate(4 * KiB, kS2);
  CHECK(b != a);
  CHECK(src.allocs == 2);  // stream 2 got its own segment
  CHECK(pool.allocate(4 * KiB, kS1) == a);
}

TEST_CASE("a block used on another stream waits for that stream's event") {
  FakeSource src(1024 * MiB);
  BlockPool pool(src);
  void* a = pool.allocate(3 * MiB, kS1);
  pool.record_use(a, kS2);
  pool.record_use(a, kS1);  // its own stream needs no event
  pool.free(a);
  REQUIRE(src.recorded == std::vector<StreamId>{kS2});
  void* b = pool.allocate(3 * MiB, kS1);
  CHECK(b != a);  // the event has not completed: a is not free yet
  src.done.insert(src.last_event);
  pool.free(b);
  CHECK(pool.allocate(3 * MiB, kS1) == a);  // lowest address of the coalesced segment
}

TEST_CASE("freed neighbours coalesce and release_cached returns whole segments") {
  FakeSource src(1024 * MiB);
  BlockPool pool(src);
  void* a = pool.allocate(512 * KiB, kS1);
  void* b = pool.allocate(512 * KiB, kS1);
  void* c = pool.allocate(512 * KiB, kS1);
  CHECK(pool.segments() == 1);
  pool.free(a);
  pool.free(c);
  pool.free(b);  // joins a, c and the tail into one 2 MiB block
  CHECK(pool.cached_bytes() == 2 * MiB);
  CHECK(pool.allocate(1 * MiB, kS1) == a);
  pool.free(a);
  pool.release_cached();
  CHECK(pool.segments() == 0);
  CHECK(pool.stats().reserved == 0);
  CHECK(src.frees == 1);
}

TEST_CASE("medium requests split 20 MiB segments, large ones get their own") {
  FakeSource src(1024 * MiB);
  BlockPool pool(src);
  void* m1 = pool.allocate(3 * MiB, kS1);
  void* m2 = pool.allocate(5 * MiB, kS1);
  CHECK(src.allocs == 1);
  CHECK(static_cast<char*>(m2) - static_cast<char*>(m1) == static_cast<ptrdiff_t>(3 * MiB));
  void* big = pool.allocate(15 * MiB, kS1);
  CHECK(src.allocs == 2);
  CHECK(pool.stats().reserved == 20 * MiB + 16 * MiB);
  // A remainder of at most 1 MiB stays with the block instead of being split off.
  CHECK(pool.block_size(big) == 16 * MiB);
  pool.free(big);
  void* again = pool.allocate(15 * MiB + 512 * KiB, kS1);
  CHECK(again == big);
  CHECK(pool.block_size(again) == 16 * MiB);
}

TEST_CASE("out of memory: cached segments are released and the request retried") {
  FakeSource src(64 * MiB);
  BlockPool pool(src);
  void* a = pool.allocate(40 * MiB, kS1);
  pool.free(a);
  void* b = pool.allocate(50 * MiB, kS1);  // needs the cached 40 MiB back first
  CHECK(b != nullptr);
  CHECK(src.frees == 1);
  CHECK(pool.stats().reserved == 50 * MiB);
}

TEST_CASE("out of memory: a RunError with the statistics and the largest allocations") {
  FakeSource src(64 * MiB);
  BlockPool pool(src);
  pool.allocate(40 * MiB, kS1);
  pool.allocate(100, kS1);
  std::string message;
  try {
    pool.allocate(30 * MiB, kS1);
  } catch (const RunError& e) {
    message = e.message();
  }
  CHECK(message.find("out of memory on cuda:0 allocating 30.00 MiB") != std::string::npos);
  CHECK(message.find("in use by 2 allocations") != std::string::npos);
  CHECK(message.find("reserved in 2 segments") != std::string::npos);
  CHECK(message.find("fake device") != std::string::npos);
  CHECK(message.find("largest live allocations: 40.00 MiB, 100 B") != std::string::npos);
}

TEST_CASE("freeing an unknown pointer is an internal error") {
  FakeSource src(64 * MiB);
  BlockPool pool(src);
  int x = 0;
  CHECK_THROWS_AS(pool.free(&x), InternalError);
}

TEST_CASE("caching off (memory.pool: false): each request its own segment, freed at once") {
  FakeSource src(64 * MiB);
  BlockPool pool(src);
  void* cached = pool.allocate(1000, kS1);  // a block of a 2 MiB segment
  CHECK(src.allocs == 1);
  pool.set_caching(false);
  CHECK_FALSE(pool.caching());
  void* a = pool.allocate(1000, kS1);
  void* b = pool.allocate(3 * MiB + 1, kS1);
  CHECK(src.allocs == 3);
  CHECK(pool.block_size(a) == 1024);  // the 512 B size class, no segment rounding
  CHECK(pool.block_size(b) == 3 * MiB + 512);
  pool.record_use(b, kS2);  // ignored: the source's free waits for the device
  MemoryStats s = pool.stats();
  CHECK(s.current == 2 * 512 + 1024 + 3 * MiB + 512);
  CHECK(s.reserved == 2 * MiB + 1024 + 3 * MiB + 512);
  pool.free(b);
  CHECK(src.frees == 1);  // straight back, no event
  CHECK(src.recorded.empty());
  pool.free(a);
  CHECK(src.frees == 2);
  pool.free(cached);  // allocated while caching: back into its segment, which is kept
  CHECK(src.frees == 2);
  s = pool.stats();
  CHECK(s.current == 0);
  CHECK(s.peak == 2 * 512 + 1024 + 3 * MiB + 512);
  pool.release_cached();
  CHECK(src.frees == 3);
  CHECK(pool.stats().reserved == 0);
  pool.set_caching(true);
  void* c = pool.allocate(1000, kS1);
  CHECK(src.allocs == 4);  // a new 2 MiB segment again
  pool.free(c);
}
