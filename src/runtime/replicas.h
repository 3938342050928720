// What keeps data-parallel replicas identical besides the gradient all-reduce:
// non-trainable buffers (batch norm's running statistics) averaged over every
// micro-batch of the step, and a check that the replicas really are identical.
#pragma once

#include <string>
#include <vector>

#include "dist/communicator.h"
#include "graph/params.h"

namespace dtrain::runtime {

// Each micro-batch's forward updates the running statistics from the same start
// (the step's), and the step keeps their mean over all micro-batches of all ranks:
// for an exponential moving average that is one update with the mean of the batch
// statistics, whatever the split of the global batch. With one micro-batch in all
// only the step's start is kept (for discard()); nothing when the model has no buffers.
class BufferAverage {
 public:
  BufferAverage(graph::FlatStore& buffers, int micro_batches, dist::Communicator& comm);
  void begin_micro(int m);  // before micro-batch m's forward
  void end_micro(int m);    // after it
  void finish();            // after the step's last micro-batch: the mean, on every rank
  void discard();           // after finish(): back to the step's start (a skipped step)

 private:
  Tensor live_, start_, sum_;
  int total_ = 1;  // micro-batches of the step over all ranks
  dist::Communicator& comm_;
};

// CRC-32C of each tensor (copied to the host when needed), compared across the ranks
// of `comm` (collective): "" when they agree, else which rank's `what` differs from rank
// 0's. The caller agrees on the outcome with every rank before failing, so a group
// that found nothing does not wait in the next collective for ranks that stopped.
std::string replica_mismatch(dist::Communicator& comm, const std::vector<Tensor>& tensors,
                             const char* what);

}  // namespace dtrain::runtime
