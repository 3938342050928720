// DeviceFeed: double-buffered, pinned, overlapped host -> device batch copies.
#include "runtime/device_feed.h"

#include <cstring>
#include <utility>

#include "kernels/memory.h"

namespace dtrain::runtime {

namespace {

// Copies `from` (host) into `pinned`, allocating the pinned and device twins on first use.
// A fresh device block may have been freed by kernels still queued on the compute
// stream (the pool reuses blocks in that stream's order), while the upload stream
// does not wait for them: so the first use waits for the device once. Later uploads
// reuse the slot's own block, whose last reader has finished (device_feed.h).
void stage_tensor(const Tensor& from, Tensor& pinned, Tensor& on_device, Device device) {
  if (!pinned.defined()) {
    pinned = Tensor::empty(from.shape(), from.dtype(), &kernels::pinned_host_allocator());
    on_device = Tensor::empty(from.shape(), from.dtype(), &kernels::device_allocator(device));
    kernels::synchronize(device);
  }
  DTRAIN_CHECK(from.shape() == pinned.shape() && from.dtype() == pinned.dtype(),
               "a batch changed shape within one feed: {} after {}", from.str(), pinned.str());
  std::memcpy(pinned.raw(), from.raw(), from.nbytes());
  kernels::upload(pinned, on_device);
}

}  // namespace

DeviceFeed::DeviceFeed(std::unique_ptr<DataFeed> host, Device device)
    : host_(std::move(host)), device_(device) {}

// A prefetched upload may still be running into the slots freed here. The compute
// stream waits for every upload (an event), so draining it drains them too.
DeviceFeed::~DeviceFeed() {
  if (!device_.is_cuda() || prefetched_ < 0) return;
  try {
    kernels::synchronize(device_);
  } catch (const std::exception&) {  // a destructor must not throw; a broken device
  }                                  // fails the next call that checks it anyway
}

void DeviceFeed::stage(int slot) {
  const FeedBatch& h = host_->next();
  Slot& s = slots_[slot];
  stage_tensor(h.input, s.pinned_input, s.input, device_);
  stage_tensor(h.labels, s.pinned_labels, s.labels, device_);
  s.next = h.next;
  s.epoch = h.epoch;
  s.labelled = h.labelled;
  s.unreadable = h.unreadable;
}

const FeedBatch& DeviceFeed::next() {
  if (device_.is_cpu()) return host_->next();
  if (prefetch_error_) std::rethrow_exception(std::exchange(prefetch_error_, nullptr));
  int slot = prefetched_;
  if (slot < 0) {
    slot = turn_;
    stage(slot);
  }
  prefetched_ = -1;
  turn_ = 1 - slot;
  const Slot& s = slots_[slot];
  out_ = {s.input, s.labels, s.next, s.epoch, s.labelled, {}};
  out_.unreadable = s.unreadable;
  return out_;
}

void DeviceFeed::prefetch() {
  if (device_.is_cpu() || prefetched_ >= 0 || prefetch_error_) return;
  try {
    stage(turn_);
  } catch (...) {  // stage() changes nothing before the host batch is read
    prefetch_error_ = std::current_exception();
    return;
  }
  prefetched_ = turn_;
}

}  // namespace dtrain::runtime
