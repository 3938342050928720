// Host allocation and the size-class cache.
#include "core/allocator.h"

#include <bit>
#include <cstdlib>

#include "core/error.h"

namespace dtrain {

void MemoryStats::add_uncached(size_t bytes) {
  current += bytes;
  reserved = current;
  peak = std::max(peak, current);
  ++allocations;
}

void MemoryStats::remove_uncached(size_t bytes) {
  DTRAIN_CHECK(current >= bytes, "freeing {} bytes with {} in use", bytes, current);
  current -= bytes;
  reserved = current;
}

void* HostAllocator::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) {
    throw Error(fmt::format("out of host memory allocating {} bytes ({} bytes in use)", bytes,
                            stats().current),
                "reduce the batch size or model size");
  }
  std::lock_guard lock(mu_);
  stats_.add_uncached(bytes);
  return p;
}

void HostAllocator::deallocate(void* ptr, size_t bytes) {
  std::free(ptr);
  std::lock_guard lock(mu_);
  stats_.remove_uncached(bytes);
}

MemoryStats HostAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  constexpr size_t kSmall = size_t{1} << 20;
  if (bytes <= kSmall) return (bytes + 511) / 512 * 512;
  constexpr size_t kLarge = size_t{64} << 20, kLargeStep = size_t{2} << 20;
  if (bytes > kLarge) return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
  const size_t pow = std::bit_floor(bytes);  // 2^k <= bytes
  const size_t step = pow / 4;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() { release_cached(); }

void CachingAllocator::set_caching(bool on) {
  if (!on) release_cached();
  std::lock_guard lock(mu_);
  if (on == caching_) return;
  DTRAIN_CHECK(stats_.current == 0, "caching switched with {} bytes in use", stats_.current);
  caching_ = on;
}

void* CachingAllocator::allocate(size_t bytes) {
  if (!caching_) {
    void* p = upstream_.allocate(bytes);
    std::lock_guard lock(mu_);
    ++stats_.allocations;
    stats_.reserved += bytes;
    stats_.current += bytes;
    stats_.peak = std::max(stats_.peak, stats_.current);
    return p;
  }
  const size_t cls = size_class(bytes);
  {
    std::lock_guard lock(mu_);
    ++stats_.allocations;
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      ++stats_.cache_hits;
      stats_.current += cls;
      stats_.peak = std::max(stats_.peak, stats_.current);
      return p;
    }
  }
  void* p = upstream_.allocate(cls);
  std::lock_guard lock(mu_);
  stats_.reserved += cls;
  stats_.current += cls;
  stats_.peak = std::max(stats_.peak, stats_.current);
  return p;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (!caching_) {
    upstream_.deallocate(ptr, bytes);
    std::lock_guard lock(mu_);
    DTRAIN_CHECK(stats_.current >= bytes, "freeing {} bytes with {} in use", bytes, stats_.current);
    stats_.current -= bytes;
    stats_.reserved -= bytes;
    return;
  }
  const size_t cls = size_class(bytes);
  std::lock_guard lock(mu_);
  DTRAIN_CHECK(stats_.current >= cls, "freeing {} bytes with {} in use", cls, stats_.current);
  stats_.current -= cls;
  free_[cls].push_back(ptr);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mu_);
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) upstream_.deallocate(p, cls);
    stats_.reserved -= cls * blocks.size();
  }
  free_.clear();
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.current;
}

CachingAllocator& host_allocator() {
  static HostAllocator upstream;
  static CachingAllocator cache(upstream);
  return cache;
}

}  // namespace dtrain
