// What the trainer reads its batches from, whatever the model family: images and
// class labels (ResNet, ViT) through the prefetching Loader, or token windows
// (GPT: causal LM, BERT: masked LM) through TextBatches over the shards that
// `dtrain data tokenize` wrote, or over synthetic tokens for throughput runs.
// A batch is (input, labels) for the graph; labels equal to -100 count for nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/sampler.h"
#include "runtime/job.h"

namespace dtrain::runtime {

struct FeedBatch {
  Tensor input;       // f32 [B, C, H, W] images, or i32 [B, T] token ids
  Tensor labels;      // i32 [B] classes, or i32 [B, T] (-100: not predicted)
  DataPosition next;  // the position to checkpoint to resume after this batch
  int64_t epoch = 0;
  int64_t labelled = 0;  // labels that count (not -100): the loss is their mean
  // data.unreadable: skip: the samples left out of this batch, "FILE: why" each.
  std::vector<std::string> unreadable;
};

// A BERT classifier's [PAD] id (the tokenizer's in data.path, or the synthetic
// layout's), which the model's attention masks (ModelOptions::pad_token_id); nullopt for
// every other model, or when data.path has no tokenizer (DataSource::open says why).
std::optional<int> padding_token(const Job& job);

// The labels of `labels` (i32, on the host) that count for the loss.
int64_t count_labelled(const Tensor& labels);

class DataFeed {
 public:
  virtual ~DataFeed() = default;
  // The next batch; valid until the next call. For evaluation feeds, padding rows
  // of the last batch have every label at -100.
  virtual const FeedBatch& next() = 0;
  virtual int64_t batches_per_epoch() const = 0;
  virtual double wait_seconds() const = 0;   // time next() spent waiting for data
  virtual std::string describe() const = 0;  // "15043 samples in .../train.bin", for errors
};

enum class FeedSplit : uint8_t { train, eval };
enum class FeedContent : uint8_t { all, labels };

// The training feed starts at `start`; the evaluation feed always at the
// beginning, in order. With several data-parallel ranks each feed yields this
// rank's slice of every global batch (data.micro_batch samples, slice `rank`). Throws Error naming
// the key or file for unusable data (a tokenizer whose vocabulary the model cannot hold, a missing
// directory, ...).
struct DataShard {
  int rank = 0;
  int world = 1;
};

// Steps in one epoch of a training feed that yields `batches` batches of data.micro_batch
// per epoch (`describe`: the feed's describe()), parallel.micro_batches batches per step;
// an Error naming data.global_batch when the training set holds less than one step.
int64_t steps_per_epoch(int64_t batches, const std::string& describe, const Job& job);

class DataSource {
 public:
  static std::unique_ptr<DataSource> open(const Job& job, uint64_t seed, DataShard shard = {});
  virtual ~DataSource() = default;
  // FeedContent::labels: the batches' labels (and label counts) only, their inputs left
  // zero, for a pipeline stage after the first, which computes on what the stage before
  // sends (an image source then decodes nothing; token sources, cheap to read, ignore it).
  virtual std::unique_ptr<DataFeed> feed(FeedSplit split, DataPosition start,
                                         FeedContent content) const = 0;
  // Both splits and where they were read from, for the run's log.
  virtual std::string describe() const = 0;
  // The classes' names by label, where the data names them (an image folder); else empty.
  virtual std::vector<std::string> class_names() const { return {}; }
  // The evaluation split's sample i by name, where it has one (an image folder's file).
  virtual std::string eval_sample_name(int64_t /*i*/) const { return {}; }
};

}  // namespace dtrain::runtime
