// Host allocation and the size-class cache.
#include "core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>

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

void CachingAllocator::add_external(size_t bytes) {
  std::lock_guard lock(mu_);
  stats_.current += bytes;
  stats_.reserved += bytes;
  stats_.peak = std::max(stats_.peak, stats_.current);
}

void CachingAllocator::remove_external(size_t bytes) {
  std::lock_guard lock(mu_);
  DTRAIN_CHECK(stats_.current >= bytes && stats_.reserved >= bytes,
               "releasing {} external bytes with {} in use", bytes, stats_.current);
  stats_.current -= bytes;
  stats_.reserved -= bytes;
}

namespace {

size_t page_size() {
  static const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The pages under `held`, merged: sorted, disjoint [begin, end) byte ranges of whole pages.
ByteRanges held_pages(const ByteRanges& held) {
  const size_t page = page_size();
  ByteRanges pages;
  for (const auto& [a, b] : held)
    if (a < b) pages.emplace_back(a / page * page, (b + page - 1) / page * page);
  std::sort(pages.begin(), pages.end());
  ByteRanges merged;
  for (const auto& r : pages) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace

size_t held_pages_bytes(const ByteRanges& held) {
  size_t n = 0;
  for (const auto& [a, b] : held_pages(held)) n += b - a;
  return n;
}

void* map_held_pages(size_t bytes, const ByteRanges& held, Unheld rest) {
  const size_t span = std::max<size_t>(bytes, 1);
  void* base = mmap(nullptr, span, rest == Unheld::zeros ? PROT_READ : PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    throw Error(
        fmt::format("cannot reserve {} bytes of address space: {}", bytes, std::strerror(errno)),
        "check ulimit -v, or reduce the model size");
  }
  for (const auto& [a, b] : held_pages(held)) {
    DTRAIN_CHECK(b <= (span + page_size() - 1) / page_size() * page_size(),
                 "held pages [{}, {}) beyond a mapping of {} bytes", a, b, bytes);
    if (mprotect(static_cast<char*>(base) + a, b - a, PROT_READ | PROT_WRITE) != 0) {
      const int err = errno;
      munmap(base, span);
      throw Error(
          fmt::format("out of host memory committing {} bytes: {}", b - a, std::strerror(err)),
          "reduce the batch size or model size");
    }
  }
  host_allocator().add_external(held_pages_bytes(held));
  return base;
}

void unmap_held_pages(void* base, size_t bytes, const ByteRanges& held) {
  DTRAIN_CHECK(munmap(base, std::max<size_t>(bytes, 1)) == 0, "munmap: {}", std::strerror(errno));
  host_allocator().remove_external(held_pages_bytes(held));
}

CachingAllocator& host_allocator() {
  static HostAllocator upstream;
  static CachingAllocator cache(upstream);
  return cache;
}

}  // namespace dtrain
