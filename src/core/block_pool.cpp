// BlockPool: best-fit blocks inside segments, per stream, with coalescing and
// event-deferred reuse. All state changes happen under one mutex.
#include "core/block_pool.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"

namespace dtrain {

namespace {

std::string human(size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (size_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (size_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= (size_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

}  // namespace

bool BlockPool::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

size_t BlockPool::size_class(size_t bytes) {
  return round_up(std::max<size_t>(bytes, 1), kGranule);
}

size_t BlockPool::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded <= kMediumRequest) return kMediumSegment;
  return round_up(rounded, kLargeRounding);
}

BlockPool::~BlockPool() {
  std::lock_guard lock(mu_);
  release_segments();
}

void* BlockPool::allocate(size_t bytes, StreamId stream) {
  std::lock_guard lock(mu_);
  process_events();
  const size_t rounded = size_class(bytes);
  if (!caching_) {
    ++stats_.allocations;
    void* p = source_.allocate_segment(rounded);
    if (p == nullptr && release_segments() > 0) p = source_.allocate_segment(rounded);
    if (p == nullptr) out_of_memory(bytes, rounded);
    direct_[p] = rounded;
    stats_.reserved += rounded;
    stats_.current += rounded;
    stats_.peak = std::max(stats_.peak, stats_.current);
    return p;
  }
  const bool small = rounded <= kSmallRequest;
  ++stats_.allocations;
  Block* b = find_free(rounded, stream, small);
  if (b != nullptr) {
    ++stats_.cache_hits;
  } else {
    b = new_segment(rounded, stream, small);
    if (b == nullptr && release_segments() > 0) b = new_segment(rounded, stream, small);
    if (b == nullptr) out_of_memory(bytes, rounded);
  }
  b = split(b, rounded);
  b->allocated = true;
  b->requested = bytes;
  live_[b->ptr] = b;
  stats_.current += b->size;
  stats_.peak = std::max(stats_.peak, stats_.current);
  return b->ptr;
}

void BlockPool::free(void* ptr) {
  std::lock_guard lock(mu_);
  if (auto d = direct_.find(ptr); d != direct_.end()) {
    source_.free_segment(ptr, d->second);
    stats_.reserved -= d->second;
    stats_.current -= d->second;
    direct_.erase(d);
    return;
  }
  auto it = live_.find(ptr);
  DTRAIN_CHECK(it != live_.end(), "freeing {} which this pool did not allocate", ptr);
  Block* b = it->second;
  live_.erase(it);
  stats_.current -= b->size;
  b->allocated = false;
  if (b->uses.empty()) {
    insert_free(b);
    return;
  }
  b->pending_events = static_cast<int>(b->uses.size());
  for (StreamId s : b->uses) pending_.push_back({b, source_.record_event(s)});
  b->uses.clear();
}

void BlockPool::record_use(void* ptr, StreamId stream) {
  std::lock_guard lock(mu_);
  if (direct_.count(ptr) > 0) return;  // freed straight to the source, which waits
  auto it = live_.find(ptr);
  DTRAIN_CHECK(it != live_.end(), "record_use of {} which this pool did not allocate", ptr);
  Block* b = it->second;
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) {
    b->uses.push_back(stream);
  }
}

void BlockPool::release_cached() {
  std::lock_guard lock(mu_);
  process_events();
  release_segments();
}

void BlockPool::set_caching(bool on) {
  std::lock_guard lock(mu_);
  caching_ = on;
  if (!on) {
    process_events();
    release_segments();
  }
}

bool BlockPool::caching() const {
  std::lock_guard lock(mu_);
  return caching_;
}

MemoryStats BlockPool::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void BlockPool::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.current;
}

size_t BlockPool::cached_bytes() const {
  std::lock_guard lock(mu_);
  return stats_.reserved - stats_.current;
}

size_t BlockPool::segments() const {
  std::lock_guard lock(mu_);
  return segment_count_;
}

size_t BlockPool::block_size(void* ptr) const {
  std::lock_guard lock(mu_);
  if (auto d = direct_.find(ptr); d != direct_.end()) return d->second;
  auto it = live_.find(ptr);
  DTRAIN_CHECK(it != live_.end(), "block_size of {} which this pool did not allocate", ptr);
  return it->second->size;
}

BlockPool::Block* BlockPool::find_free(size_t rounded, StreamId stream, bool small) {
  auto& set = small ? free_small_ : free_large_;
  Block key;
  key.stream = stream;
  key.size = rounded;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

BlockPool::Block* BlockPool::new_segment(size_t rounded, StreamId stream, bool small) {
  const size_t size = segment_size(rounded);
  void* p = source_.allocate_segment(size);
  if (p == nullptr) return nullptr;
  Block* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = size;
  b->stream = stream;
  b->small = small;
  stats_.reserved += size;
  ++segment_count_;
  return b;
}

// Keeps the first `rounded` bytes of the free block b and returns the rest to
// the free set when it is worth keeping apart.
BlockPool::Block* BlockPool::split(Block* b, size_t rounded) {
  const size_t rest = b->size - rounded;
  const bool worth = b->small ? rest >= kGranule : rest > kSmallRequest;
  if (!worth) return b;
  Block* r = new Block;
  r->ptr = b->ptr + rounded;
  r->size = rest;
  r->stream = b->stream;
  r->small = b->small;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size = rounded;
  (b->small ? free_small_ : free_large_).insert(r);
  return b;
}

void BlockPool::insert_free(Block* b) {
  auto& set = b->small ? free_small_ : free_large_;
  auto is_free = [](const Block* n) {
    return n != nullptr && !n->allocated && n->pending_events == 0;
  };
  if (is_free(b->prev)) {
    Block* p = b->prev;
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (is_free(b->next)) {
    Block* n = b->next;
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  set.insert(b);
}

void BlockPool::process_events() {
  std::vector<Pending> still;
  for (const Pending& p : pending_) {
    if (!source_.event_done(p.event)) {
      still.push_back(p);
    } else if (--p.block->pending_events == 0) {
      insert_free(p.block);
    }
  }
  pending_.swap(still);
}

size_t BlockPool::release_segments() {
  size_t released = 0;
  for (auto* set : {&free_small_, &free_large_}) {
    for (auto it = set->begin(); it != set->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      source_.free_segment(b->ptr, b->size);
      stats_.reserved -= b->size;
      --segment_count_;
      released += b->size;
      it = set->erase(it);
      delete b;
    }
  }
  return released;
}

void BlockPool::out_of_memory(size_t bytes, size_t rounded) {
  std::vector<size_t> sizes;
  for (const auto& [ptr, b] : live_) sizes.push_back(b->requested);
  const size_t shown = std::min<size_t>(sizes.size(), 5);
  std::partial_sort(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(shown), sizes.end(),
                    std::greater<>());
  std::string largest;
  for (size_t i = 0; i < shown; ++i) largest += (i ? ", " : "") + human(sizes[i]);
  throw RunError(
      fmt::format("out of memory on {} allocating {} (class {}): {} in use by {} allocations "
                  "(peak {}), {} reserved in {} segments ({} cached but unusable for this "
                  "size); device: {}; largest live allocations: {}",
                  source_.device().str(), human(bytes), human(rounded), human(stats_.current),
                  live_.size(), human(stats_.peak), human(stats_.reserved), segment_count_,
                  human(stats_.reserved - stats_.current), source_.memory_info(),
                  largest.empty() ? "none" : largest),
      "reduce the micro-batch size, turn on activation checkpointing (memory.checkpointing) "
      "or shard the model state (parallel.zero_stage)");
}

}  // namespace dtrain
