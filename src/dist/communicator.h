// The communicator: collectives and point-to-point over one group of ranks, on
// the buffers of one device. Backends: MPI for host buffers (mpi_communicator.cpp,
// built with DTRAIN_MPI), NCCL for one GPU's buffers (nccl_communicator.cpp, built
// with CUDA; the host communicator carries its id) and self (a group of one on the
// host: every collective is the identity). Every operation is
// issued in the same order on every rank of the group; the asynchronous ones
// run in that order on the communicator's own thread and return a Handle.
// Every call is counted (sequence number, bytes, seconds). No algorithm choice
// lives here beyond what all_reduce dispatches to (allreduce.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "dist/options.h"

namespace dtrain::dist {

enum class ReduceOp : uint8_t { sum, max };

// The completion of one asynchronous operation. wait() blocks until it is done
// and rethrows its error (an Error for a failed MPI call); test() does not block.
class Handle {
 public:
  Handle() = default;
  struct State;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait();
  bool test();
  bool valid() const { return state_ != nullptr; }
  // After wait(): when the operation started running (steady_clock seconds since its
  // epoch) and for how long (on NCCL: the device's time between its events); zeros
  // for an operation that did not run (the self communicator's).
  struct Timing {
    double start = 0, seconds = 0;
  };
  Timing timing() const;

 private:
  std::shared_ptr<State> state_;
};

struct CommStats {
  uint64_t calls = 0;      // operations issued (the last one's sequence number)
  uint64_t bytes = 0;      // payload bytes of those operations (the buffer, once per call)
  double seconds = 0.0;    // time the operations spent running (on the comm thread)
  uint64_t completed = 0;  // operations finished (calls - completed: queued or running)
  // Bytes each rank moves over its links, by the bus-bandwidth convention of NVIDIA's
  // nccl-tests: all-reduce 2(n-1)/n of the buffer; reduce-scatter, all-gather, reduce
  // and broadcast (n-1)/n (what a bandwidth-optimal algorithm sends per rank); n ranks.
  // The ZeRO paper's volumes are in these units (DP 2 x params, ZeRO-1/2 the same).
  double bus_bytes = 0.0;
};

// How the group's ranks sit on nodes (for hierarchical all-reduce).
struct Topology {
  int nodes = 1;
  int ranks_per_node = 1;  // 0: the nodes hold different numbers of ranks
};

// One operation as the flight recorder keeps it (for the watchdog's messages).
struct OpRecord {
  uint64_t seq = 0;
  std::string op;  // "all_reduce(ring)", "broadcast", ...
  size_t bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "mpi", "nccl" or "self"
  // Where the buffers live: the host (mpi, self) or one GPU (nccl).
  virtual Device device() const { return Device::cpu(); }

  // Buffers: contiguous tensors on device() of f32, f64, i32 or i64 (NCCL also f16
  // and bf16). In place where one buffer. On NCCL an operation starts after the work
  // already queued on the device's compute stream, and wait() returns once it has
  // finished on the device.
  // all_reduce with algo auto_ is an internal error: the caller resolves it (allreduce.h).
  virtual Handle all_reduce_async(Tensor buf, ReduceOp op = ReduceOp::sum,
                                  AllreduceAlgo algo = AllreduceAlgo::native) = 0;
  void all_reduce(Tensor buf, ReduceOp op = ReduceOp::sum,
                  AllreduceAlgo algo = AllreduceAlgo::native) {
    all_reduce_async(std::move(buf), op, algo).wait();
  }
  // in [size * n] -> out [n]: out = the sum of every rank's r-th block (r = rank()).
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in [n] -> out [size * n], block r from rank r. `in` may be out's own block (out
  // viewed at rank() * n): gathered in place, without a send buffer.
  virtual Handle all_gather_async(Tensor in, Tensor out) = 0;
  void all_gather(const Tensor& in, Tensor& out) { all_gather_async(in, out).wait(); }
  // in [size * n] -> out [size * n]: block r of `in` goes to rank r, and block r of
  // `out` comes from rank r (its block rank()). Separate buffers. Its bus bytes are
  // (n-1)/n of `out`, as an all-gather's (what each rank sends). Compressed gradients' two-phase
  // exchange sends each rank's chunk to the rank that sums it.
  virtual Handle all_to_all_async(Tensor in, Tensor out) = 0;
  virtual void broadcast(Tensor& buf, int root) = 0;
  // buf [sum of counts], in place: block r (after the blocks of the ranks before it)
  // comes from rank r, which wrote it before the call; counts may be 0. Data movement
  // only, so any dtype, halves included (MPI too). ZeRO-3 gathers a block's parameters
  // with it while the previous block computes. Counted as an all-gather of the buffer.
  virtual Handle all_gatherv_async(Tensor buf, std::vector<int64_t> counts) = 0;
  // The sum over every rank's `buf` lands in root's `buf` (in place); the other ranks'
  // `buf` is left as it was. ZeRO sends each bucket's piece to the rank that owns it.
  virtual Handle reduce_async(Tensor buf, int root) = 0;
  void reduce(Tensor buf, int root) { reduce_async(std::move(buf), root).wait(); }
  virtual void send(const Tensor& buf, int peer) = 0;
  virtual void recv(Tensor& buf, int peer) = 0;
  // Point-to-point in one go: every send and receive of `ops` is posted at once and all
  // are complete when it returns, so two neighbours may send to each other in one call
  // (the pipeline schedules' exchanges) without either waiting for the other first.
  // Between two ranks the messages match in the order given. Data movement only: any
  // dtype. Counted as one operation of the bytes sent and received.
  struct PeerOp {
    bool send = true;
    int peer = 0;
    Tensor buf;
  };
  virtual void exchange(const std::vector<PeerOp>& ops) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new communicator, ordered by key then rank.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Collective on the first call (it builds the node groups); then cached.
  virtual Topology topology() = 0;
  // Consecutive groups of `n` ranks count as nodes (unset: the shared-memory split).
  // Takes effect at the first topology() or hierarchical all-reduce; later calls are
  // an internal error. Local: every rank must pass the same value.
  virtual void set_ranks_per_node(std::optional<int> n) = 0;

  virtual CommStats stats() const = 0;
  virtual OpRecord last_op() const = 0;  // the newest operation issued (seq 0: none yet)
  // The flight recorder's front: the oldest operation issued and not finished (seq 0:
  // none). Thread-safe; the watchdog polls it.
  virtual OpRecord oldest_pending() const = 0;
};

// A group of one rank.
std::unique_ptr<Communicator> make_self_communicator();

// The world: MPI when this process was started by a launcher (mpirun, srun) and
// dtrain was built with MPI, else self. Initialises MPI (MPI_THREAD_MULTIPLE
// requested, at least MPI_THREAD_SERIALIZED required) on first use; MPI is
// finalised at exit. `ranks_per_node` groups consecutive ranks into emulated nodes
// (hierarchical all-reduce); unset: the MPI shared-memory split.
struct WorldOptions {
  std::optional<int> ranks_per_node;
};
std::unique_ptr<Communicator> make_world_communicator(const WorldOptions& options = {});

// NCCL over the ranks of `host` (rank r there is rank r here) for the buffers of
// `device` (cuda:N). Collective over `host`, which broadcasts rank 0's ncclUniqueId.
// Nodes for hierarchical all-reduce: consecutive groups of `ranks_per_node`, or
// the ranks that share a host name. Without CUDA and NCCL: Error saying how to rebuild.
bool nccl_available();  // built with NCCL
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, Device device,
                                                     std::optional<int> ranks_per_node);

}  // namespace dtrain::dist
