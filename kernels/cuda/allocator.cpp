// The CUDA side of device memory, kept thin: segments from cudaMalloc and
// events for cross-stream reuse (the bookkeeping is core/block_pool.h, tested
// on the CPU), one caching allocator per device whose blocks belong to the
// device's backend stream, and page-locked host memory for loader buffers.
// All are created on first use and never destroyed (see context.cpp).
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/block_pool.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

std::string gib(size_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30));
}

// cudaMalloc / cudaFree and cudaEvent_t behind ids. Called with the pool's lock held.
class CudaSegments final : public SegmentSource {
 public:
  explicit CudaSegments(int device) : device_(device) {}

  void* allocate_segment(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());  // clears the error it recorded: handled here
      return nullptr;
    }
    DTRAIN_CUDA_CHECK(err);
    return p;
  }
  void free_segment(void* ptr, size_t) override { DTRAIN_CUDA_CHECK(cudaFree(ptr)); }

  uint64_t record_event(StreamId stream) override {
    cudaEvent_t ev = nullptr;
    DTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    DTRAIN_CUDA_CHECK(cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream)));
    events_[++next_event_] = ev;
    return next_event_;
  }
  bool event_done(uint64_t event) override {
    cudaEvent_t ev = events_.at(event);
    const cudaError_t err = cudaEventQuery(ev);
    if (err == cudaErrorNotReady) {
      static_cast<void>(cudaGetLastError());  // "not ready" is an answer, not an error
      return false;
    }
    DTRAIN_CUDA_CHECK(err);
    DTRAIN_CUDA_CHECK(cudaEventDestroy(ev));
    events_.erase(event);
    return true;
  }

  Device device() const override { return Device::cuda(device_); }
  std::string memory_info() const override {
    size_t free_bytes = 0, total = 0;
    DTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return fmt::format("{} free of {}", gib(free_bytes), gib(total));
  }

 private:
  int device_;
  std::unordered_map<uint64_t, cudaEvent_t> events_;
  uint64_t next_event_ = 0;
};

// dtrain::Allocator over a BlockPool: allocations belong to the device's stream.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device)
      : ctx_(Context::get(device)), segments_(device), pool_(segments_) {}

  void* allocate(size_t bytes) override {
    ctx_.activate();
    return pool_.allocate(bytes, reinterpret_cast<StreamId>(ctx_.stream()));
  }
  void deallocate(void* ptr, size_t) override {
    ctx_.activate();
    pool_.free(ptr);
  }
  Device device() const override { return Device::cuda(ctx_.device()); }
  MemoryStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }
  void set_caching(bool on) {
    ctx_.activate();
    pool_.set_caching(on);
  }

 private:
  Context& ctx_;
  CudaSegments segments_;
  BlockPool pool_;
};

// cudaHostAlloc / cudaFreeHost, the upstream of the pinned CachingAllocator.
class PinnedHost final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      throw RunError(fmt::format("out of pinned host memory allocating {} ({} pinned in use)",
                                 bytes, stats().current),
                     "lower data.workers or the batch size");
    }
    DTRAIN_CUDA_CHECK(err);
    std::lock_guard lock(mu_);
    stats_.add_uncached(bytes);
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    DTRAIN_CUDA_CHECK(cudaFreeHost(ptr));
    std::lock_guard lock(mu_);
    stats_.remove_uncached(bytes);
  }
  Device device() const override { return Device::cpu(); }
  MemoryStats stats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  mutable std::mutex mu_;
  MemoryStats stats_;
};

}  // namespace

Allocator& allocator(int device) {
  static std::mutex mu;
  static std::map<int, CudaAllocator*> allocators;
  std::lock_guard lock(mu);
  auto it = allocators.find(device);
  if (it == allocators.end()) it = allocators.emplace(device, new CudaAllocator(device)).first;
  return *it->second;
}

void set_pool_caching(int device, bool on) {
  static_cast<CudaAllocator&>(allocator(device)).set_caching(on);
}

Allocator& pinned_host_allocator() {
  static PinnedHost* upstream = [] {
    Context::get(0);  // fails with "no CUDA device available" before cudaHostAlloc does
    return new PinnedHost;
  }();
  static CachingAllocator* cache = new CachingAllocator(*upstream);
  return *cache;
}

}  // namespace dtrain::kernels::cuda_ops
