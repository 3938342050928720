// Batches on the training device. On the CPU the DataFeed's own batches pass
// through untouched. On CUDA each host batch is copied into one of two pinned
// staging buffers and uploaded (kernels::upload: the device's second stream) into
// one of two device buffers, so the transfer of batch k+1 runs while batch k
// computes. The caller's loop:
//   const FeedBatch& b = feed.next();  // batch k on the device (prefetched, or staged now)
//   ... enqueue forward / backward on b ...
//   feed.prefetch();                   // host batch k+1 -> pinned -> device, overlapped
//   ... read the loss back (this synchronizes the device) ...
// Why two buffers suffice: slot (k+1) % 2 was last read by batch k-1, and the caller
// synchronized after batch k-1 (its loss readback) before calling prefetch().
#pragma once

#include <exception>
#include <memory>

#include "runtime/data_feed.h"

namespace dtrain::runtime {

class DeviceFeed {
 public:
  DeviceFeed(std::unique_ptr<DataFeed> host, Device device);
  ~DeviceFeed();
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;

  // The next batch, on the device; valid until the next call. Requires a device
  // synchronize (any readback) since the previous batch's kernels were enqueued.
  const FeedBatch& next();
  // Starts moving the following batch now (a no-op on the CPU or when one is ready). A
  // batch that cannot be read throws from the next call of next(), not from here: the
  // caller reads (and agrees on) batches where it calls next().
  void prefetch();

  int64_t batches_per_epoch() const { return host_->batches_per_epoch(); }
  double wait_seconds() const { return host_->wait_seconds(); }
  std::string describe() const { return host_->describe(); }

 private:
  struct Slot {
    Tensor pinned_input, pinned_labels;  // host staging (page-locked)
    Tensor input, labels;                // on the device
    DataPosition next;
    int64_t epoch = 0;
    int64_t labelled = 0;
    std::vector<std::string> unreadable;
  };
  void stage(int slot);

  std::unique_ptr<DataFeed> host_;
  Device device_;
  Slot slots_[2];
  int turn_ = 0;                       // the slot the next stage() fills
  int prefetched_ = -1;                // the slot holding a batch not yet returned, or -1
  std::exception_ptr prefetch_error_;  // what prefetch()'s read threw, for next()
  FeedBatch out_;
};

}  // namespace dtrain::runtime
