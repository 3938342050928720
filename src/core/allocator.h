// Memory allocators. Allocator is the interface every device's memory goes
// through; HostAllocator is plain aligned host memory; CachingAllocator keeps
// freed blocks in size classes for reuse and reports current / peak / reserved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/device.h"

namespace dtrain {

struct MemoryStats {
  size_t current = 0;   // bytes handed out and not yet returned (size-class rounded)
  size_t peak = 0;      // high-water mark of current
  size_t reserved = 0;  // bytes held from the upstream allocator (in use + cached)
  size_t allocations = 0;
  size_t cache_hits = 0;

  // Bookkeeping of an allocator without a cache (what it holds is what is in use).
  void add_uncached(size_t bytes);
  void remove_uncached(size_t bytes);  // a dtrain bug (CHECK) if more than is in use
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;  // never returns null; throws on out-of-memory
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual MemoryStats stats() const = 0;
  // The peak starts again from what is in use now (dtrain bench between models); a
  // no-op for an allocator that keeps no peak.
  virtual void reset_peak() {}
};

// 64-byte aligned host memory straight from the C library.
class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return Device::cpu(); }
  MemoryStats stats() const override;

 private:
  mutable std::mutex mu_;
  MemoryStats stats_;
};

// Caches freed blocks by size class. Requests round up to a class: multiples
// of 512 B below 1 MiB, then four classes per power of two (1, 1.25, 1.5, 1.75 x 2^k),
// so reuse is frequent and waste is at most 25%; above 64 MiB multiples of 2 MiB (the
// flat parameter, gradient and optimizer buffers: a 350 GB buffer would otherwise take
// a 412 GB class; the activations of a step repeat their sizes exactly, so their
// reuse needs no coarse classes). Thread-safe.
class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(Allocator& upstream) : upstream_(upstream) {}
  ~CachingAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return upstream_.device(); }
  MemoryStats stats() const override;
  void release_cached();  // returns every cached block to the upstream allocator
  void reset_peak() override;
  // Memory of this allocator's device taken outside it (held_pages: the committed pages
  // of a mapping) counted in its statistics as in use while it lives.
  void add_external(size_t bytes);
  void remove_external(size_t bytes);
  // false: no cache and no size classes: every request goes to the upstream allocator
  // at its size and every free straight back (memory.pool: false, for debugging). Set
  // it before anything is allocated: a block is returned by the rule it was taken with.
  void set_caching(bool on);
  bool caching() const { return caching_; }

  static size_t size_class(size_t bytes);

 private:
  Allocator& upstream_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  MemoryStats stats_;
  bool caching_ = true;
};

// The process-wide host allocator: a CachingAllocator over HostAllocator.
CachingAllocator& host_allocator();

// Byte ranges [begin, end) of a buffer.
using ByteRanges = std::vector<std::pair<size_t, size_t>>;
// The host memory a held_pages mapping commits for `held`: every page a range touches,
// once (what host_allocator() counts for it).
size_t held_pages_bytes(const ByteRanges& held);
// What the pages outside `held` of a held-pages mapping are: absent (reserved, never
// committed, faulting when touched: a pipeline stage's share of the whole model's flat
// buffers) or zeros (read-only: a read maps the kernel's one shared zero page, a write
// faults: the optimizer state of frozen parameters, which every reader sees as 0).
enum class Unheld : uint8_t { absent, zeros };
// `bytes` of host address space of which only the pages under `held` are backed
// (read-write, zero-filled), the rest as `rest` says, addressed as the whole buffer
// (the same offsets as a fully backed one). Counted in host_allocator() by
// held_pages_bytes(held); unmap_held_pages releases it. Throws Error when the system
// refuses.
void* map_held_pages(size_t bytes, const ByteRanges& held, Unheld rest = Unheld::absent);
void unmap_held_pages(void* base, size_t bytes, const ByteRanges& held);

}  // namespace dtrain
