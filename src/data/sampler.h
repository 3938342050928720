// Which samples each batch holds: a per-epoch order of the dataset (identity, or
// a permutation drawn from (seed, epoch)), cut into global batches of batch x
// world samples, of which rank r takes the r-th slice. Loads no data. A global
// batch is a contiguous run of the epoch's order, so a position is just (epoch,
// offset into that order), independent of the world size: a resumed run with the
// same global batch sees the same global batches at any world size. A step of
// `micro_steps` batches (gradient accumulation) keeps or drops the epoch's tail as a
// whole, so where an epoch ends does not depend on how a step's samples are split
// between ranks and micro-batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

enum class Shuffle : uint8_t { off, on };
// The epoch's last, partial global batch: dropped, or padded by wrapping around
// to the start of the same epoch's order.
enum class Tail : uint8_t { drop, pad };

struct DataPosition {
  int64_t epoch = 0;
  int64_t offset = 0;  // samples of the epoch's order already taken, by all ranks together
  bool operator==(const DataPosition&) const = default;
};

struct SamplerConfig {
  int64_t dataset_size = 0;
  int64_t batch = 1;  // per rank
  int rank = 0;
  int world = 1;
  // Batches per optimizer step (parallel.micro_batches when training): Tail::drop drops
  // the epoch's last partial step, Tail::pad pads it whole.
  int64_t micro_steps = 1;
  uint64_t seed = 0;
  Shuffle shuffle = Shuffle::on;
  Tail tail = Tail::drop;
  // The key that cut this split (data.limit.train), when one did: errors name it.
  std::string cut_by;
};

// The order of epoch `epoch` into `out` (resized to n). Shuffle::on is Fisher-Yates
// from the back: step t (t = 0 .. n-2) swaps slot j = n-1-t with slot
// floor(u * (j+1) / 2^64), u the t-th 64-bit draw of Philox(seed, stream
// (shuffle, 0, epoch)) (block t/2, words 2(t%2) high and 2(t%2)+1 low).
void epoch_order(int64_t n, uint64_t seed, int64_t epoch, Shuffle shuffle,
                 std::vector<int64_t>& out);

struct BatchInfo {
  int64_t epoch = 0;  // the epoch the batch belongs to
  int64_t valid = 0;  // leading samples of this rank's slice that are not padding
  DataPosition next;  // where the batch after it starts
};

// "one global batch of 512 (16 per rank x 1 ranks x 32 micro-batches)": a step's samples
// and how they split, for the errors about a split smaller than one.
std::string global_batch_phrase(int64_t batch, int world, int64_t micro_steps);

class Sampler {
 public:
  explicit Sampler(SamplerConfig config, DataPosition start = {});

  // This rank's next batch: config.batch dataset indices into `out`.
  BatchInfo next(int64_t* out);
  DataPosition position() const { return pos_; }  // where the next batch starts
  int64_t batches_per_epoch() const;
  int64_t global_batch() const { return config_.batch * config_.world; }
  int64_t step_samples() const { return global_batch() * config_.micro_steps; }
  const SamplerConfig& config() const { return config_; }

 private:
  bool has_batch_at(int64_t offset) const;
  DataPosition normalise(DataPosition p) const;

  SamplerConfig config_;
  DataPosition pos_;
  std::vector<int64_t> order_;  // of epoch order_epoch_
  int64_t order_epoch_ = -1;
};

}  // namespace dtrain
