// BlockPool: the bookkeeping of a device caching allocator, in plain C++ so it
// is tested on the CPU with a fake upstream. Memory comes from a SegmentSource
// (cudaMalloc on a GPU) in large segments; requests are rounded to a size
// class, carved best-fit out of free blocks of the same stream and pool, and
// coalesced with free neighbours when freed. It never touches the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace dtrain {

using StreamId = uintptr_t;  // an opaque stream handle (cudaStream_t on CUDA)

// Where segments come from, and the events that make cross-stream reuse safe.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual void* allocate_segment(size_t bytes) = 0;  // nullptr when out of memory
  virtual void free_segment(void* ptr, size_t bytes) = 0;
  virtual uint64_t record_event(StreamId stream) = 0;  // marks "now" on stream
  virtual bool event_done(uint64_t event) = 0;         // true also releases the event
  virtual Device device() const = 0;
  virtual std::string memory_info() const = 0;  // the device's own view ("free X of Y")
};

// Policy (the same shape as PyTorch's CUDA caching allocator):
// - size classes: requests round up to a multiple of 512 B (kGranule);
// - small requests (<= 1 MiB) come from 2 MiB segments, medium ones (<= 10 MiB)
//   from 20 MiB segments, larger ones get their own segment rounded to 2 MiB;
// - a block is split when the rest is at least 512 B (small pool) or more than
//   1 MiB (large pool), so big cached blocks are not shredded by small requests;
// - a segment belongs to the stream it was allocated for; its blocks are reused
//   only for requests on that stream. A block also used on other streams
//   (record_use) is reusable only after events recorded on those streams at
//   free time have completed;
// - out of memory: free every fully cached segment and retry once; then throw
//   a dtrain::Error with the statistics and the largest live allocations.
class BlockPool {
 public:
  static constexpr size_t kGranule = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMediumRequest = size_t{10} << 20;
  static constexpr size_t kMediumSegment = size_t{20} << 20;
  static constexpr size_t kLargeRounding = size_t{2} << 20;

  explicit BlockPool(SegmentSource& source) : source_(source) {}
  ~BlockPool();  // returns cached segments; live blocks are the owner's leak
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  void* allocate(size_t bytes, StreamId stream);
  void free(void* ptr);
  void record_use(void* ptr, StreamId stream);  // ptr is also used on `stream`
  void release_cached();                        // frees every segment with no live block
  // memory.pool: false: each request becomes its own segment of its size class and
  // each free goes straight back to the source (on CUDA, cudaFree waits for the
  // device, so no event is needed). Blocks keep the mode they were allocated in.
  void set_caching(bool on);
  bool caching() const;
  MemoryStats stats() const;
  void reset_peak();
  size_t cached_bytes() const;  // reserved minus in use
  size_t segments() const;
  size_t block_size(void* ptr) const;  // the rounded size of a live block

  static size_t size_class(size_t bytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    StreamId stream = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours inside the segment
    Block* next = nullptr;
    size_t requested = 0;
    std::vector<StreamId> uses;  // other streams that used it
    int pending_events = 0;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Pending {
    Block* block;
    uint64_t event;
  };

  Block* find_free(size_t rounded, StreamId stream, bool small);
  Block* new_segment(size_t rounded, StreamId stream, bool small);
  Block* split(Block* b, size_t rounded);
  void insert_free(Block* b);  // coalesces with free neighbours
  void process_events();
  size_t release_segments();  // returns bytes released
  [[noreturn]] void out_of_memory(size_t bytes, size_t rounded);

  SegmentSource& source_;
  mutable std::mutex mu_;
  std::set<Block*, BySize> free_small_, free_large_;
  std::unordered_map<void*, Block*> live_;
  std::unordered_map<void*, size_t> direct_;  // uncached allocations -> their size
  bool caching_ = true;
  std::vector<Pending> pending_;
  MemoryStats stats_;
  size_t segment_count_ = 0;
};

}  // namespace dtrain
