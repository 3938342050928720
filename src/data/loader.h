// The prefetching loader: batches of images f32 [B, C, H, W] and labels i32 [B],
// filled by N std::threads (0: in the caller's thread) into a ring of reusable
// slots up to K batches ahead, handed out strictly in order. Batch k holds the
// same bits whatever the worker count: its samples come from the Sampler and its
// augmentation from (seed, epoch, sample). Not a thread pool for compute.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/sampler.h"

namespace dtrain {

struct LoaderConfig {
  SamplerConfig sampler;  // dataset_size is taken from the dataset
  DataPosition start;
  AugmentConfig augment;
  int workers = 0;
  int prefetch = 2;         // batches ready ahead of the one the consumer holds (workers > 0)
  bool read_images = true;  // false: labels only, the images left zero (nothing decoded)
  // data.unreadable: skip: an image whose read throws dtrain::Error is left zero with the
  // ignore label (-100), its message in the batch's `unreadable`; else the batch fails.
  bool skip_unreadable = false;
};

// Train: shuffle and drop_last as the job says, augmentation from data.augment
// (or the dataset's default; image-folder: a random resized crop). Test: in order,
// padded, never augmented. Both normalise with the dataset's channel statistics (of
// `channels`, the model's, where the dataset has no fixed shape) and draw from `seed`.
LoaderConfig make_loader_config(const DataOptions& options, Split split, uint64_t seed,
                                int rank = 0, int world = 1, DataPosition start = {},
                                int channels = 3);

// The statistics a dataset's inputs are normalised with, in training and evaluation
// alike (dtrain predict normalises its image files with them): the dataset's own
// channels, or `channels` (the model's) where it has no fixed shape; synthetic pixels
// stay as drawn.
ChannelStats input_normalization(DatasetName dataset, int channels);

// A view of one ring slot: valid until the next call to Loader::next().
struct Batch {
  Tensor images;      // f32 [B, C, H, W], normalised
  Tensor labels;      // i32 [B]
  int64_t index = 0;  // batches this loader handed out before this one
  int64_t epoch = 0;
  int64_t valid = 0;  // leading samples that are not wrap-around padding
  DataPosition next;  // the position to checkpoint to resume after this batch
  // skip_unreadable: the errors of the samples left out of this batch ("FILE: why").
  std::vector<std::string> unreadable;
};

class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderConfig config);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Blocks until the next batch is ready; rethrows a worker's exception for it.
  const Batch& next();
  // Seconds the consumer spent inside next() waiting for data (workers = 0: loading).
  double wait_seconds() const { return wait_seconds_; }
  DataPosition position() const { return position_; }  // after the last batch handed out
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

 private:
  enum class SlotState : uint8_t { free, filling, ready };
  struct Slot {
    Batch batch;
    std::vector<int64_t> indices;
    int64_t ticket = -1;
    SlotState state = SlotState::free;
    std::exception_ptr error;
  };

  void plan(Slot& slot, int64_t ticket);  // under mu_ (the sampler is sequential)
  void fill(Slot& slot, std::vector<float>& scratch) const;
  void worker_loop();
  const Batch& next_inline();

  std::shared_ptr<const Dataset> dataset_;
  Augmenter augmenter_;
  bool read_images_;
  bool skip_unreadable_;
  int workers_;
  int64_t batches_per_epoch_ = 0;
  std::vector<Slot> slots_;
  std::vector<float> scratch_;  // workers = 0 only

  std::mutex mu_;
  std::condition_variable work_cv_;   // workers: a slot was released, or stop
  std::condition_variable ready_cv_;  // consumer: a slot became ready
  Sampler sampler_;                   // guarded by mu_
  int64_t next_ticket_ = 0;           // the next batch a worker takes
  int64_t released_ = 0;              // batches the consumer has finished with
  int64_t handed_out_ = 0;            // batches next() has returned
  bool holding_ = false;              // the consumer holds slot (handed_out_-1)
  bool stop_ = false;

  double wait_seconds_ = 0;  // consumer thread only
  DataPosition position_;    // consumer thread only
  std::vector<std::thread> threads_;
};

}  // namespace dtrain
