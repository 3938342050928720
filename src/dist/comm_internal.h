// Pieces shared by the communicator backends (self, MPI): the state behind a
// Handle, the thread-safe call counter, buffer checks and op names. Internal to
// src/dist; nothing here talks to MPI.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "dist/communicator.h"

namespace dtrain::dist {

struct Handle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Handle::Timing timing;  // set by the worker before finish()
  // Run once by the first wait() that sees the operation done, on the waiting thread
  // (NCCL: the buffers it kept for the operation go back to the allocator then).
  std::function<void()> after_wait;

  void finish(std::exception_ptr e);
};

// A handle that is already complete (the self communicator's operations).
Handle completed_handle();

// Counts issued operations and their bytes and time; read from any thread.
class OpCounter {
 public:
  uint64_t issue(std::string op, size_t bytes);  // returns the op's sequence number
  void set_ranks(int n) { ranks_ = n; }          // for CommStats::bus_bytes
  void finished(double seconds);                 // one operation done after `seconds`
  CommStats stats() const;
  OpRecord last() const;
  OpRecord oldest_pending() const;  // seq 0 when nothing is pending

 private:
  mutable std::mutex mu_;
  CommStats stats_;
  OpRecord last_;
  std::deque<OpRecord> pending_;  // issued, not finished (operations finish in issue order)
  int ranks_ = 1;
};

// A contiguous host tensor of f32, f64, i32 or i64 (internal check: the caller's bug).
void check_comm_buffer(const Tensor& t, const char* op);
// Throws Error naming comm.ranks_per_node when it is set and not positive.
void check_world_options(const WorldOptions& options);
std::string all_reduce_name(AllreduceAlgo algo, ReduceOp op);  // "all_reduce(ring)"

}  // namespace dtrain::dist
