// The MPI communicator (built with DTRAIN_MPI). Every operation, blocking or not,
// is queued to one worker thread per communicator and runs there in issue order;
// the issuing thread only waits on a Handle. MPI is initialised on first use and
// finalised at exit, except after an exception unwound a communicator (a peer may
// still wait in a collective: leaving without MPI_Finalize lets mpirun end the job).
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <deque>
#include <functional>
#include <thread>

#include "core/error.h"
#include "dist/comm_internal.h"
#include "dist/launcher.h"
#include "dist/mpi_allreduce.h"
#include "dist/mpi_common.h"

namespace dtrain::dist {

void mpi_failed(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw RunError(fmt::format("MPI call failed at {}:{}: {}: {} (code {})", file, line, call,
                             std::string(text, static_cast<size_t>(len)), code));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    default:
      DTRAIN_CHECK(false, "no MPI datatype for {}", dtype_name(dtype));
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

namespace {

std::atomic<bool> g_skip_finalize{false};

void finalize_at_exit() {
  int finalized = 0;
  if (g_skip_finalize.load() || MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  MPI_Finalize();
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

// The thread level MPI provides, initialising it on the first call.
int mpi_thread_level() {
  static const int level = [] {
    int initialized = 0, provided = MPI_THREAD_SINGLE;
    DTRAIN_MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized) {
      DTRAIN_MPI_CHECK(MPI_Query_thread(&provided));
    } else {
      DTRAIN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit(finalize_at_exit);
    }
    DTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    if (provided < MPI_THREAD_SERIALIZED) {
      throw RunError(fmt::format("this MPI library provides {}; dtrain needs at least "
                                 "MPI_THREAD_SERIALIZED",
                                 thread_level_name(provided)),
                     "use an MPI built with thread support (Open MPI from Debian has it)");
    }
    return provided;
  }();
  return level;
}

// One thread running queued tasks in order; sleeps on a condition variable when idle.
class Worker {
 public:
  using Task = std::function<void()>;
  Worker() : q_(std::make_shared<Queue>()), thread_(loop, q_) {}
  ~Worker() {
    {
      std::lock_guard lock(q_->mu);
      q_->stop = true;
    }
    q_->cv.notify_one();
    // An abandoned worker may be blocked in MPI for a peer that is gone: leave it.
    if (abandoned_) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  void post(Task task) {
    {
      std::lock_guard lock(q_->mu);
      q_->tasks.push_back(std::move(task));
    }
    q_->cv.notify_one();
  }
  void abandon() { abandoned_ = true; }

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> tasks;
    bool stop = false;
  };
  static void loop(std::shared_ptr<Queue> q) {
    for (;;) {
      Task task;
      {
        std::unique_lock lock(q->mu);
        q->cv.wait(lock, [&] { return q->stop || !q->tasks.empty(); });
        if (q->tasks.empty()) return;
        task = std::move(q->tasks.front());
        q->tasks.pop_front();
      }
      task();
    }
  }

  std::shared_ptr<Queue> q_;
  std::thread thread_;
  std::atomic<bool> abandoned_{false};
};

// With MPI_THREAD_MULTIPLE each communicator has its own worker; with SERIALIZED
// all of them share one, so that no two threads are ever inside MPI at once.
std::shared_ptr<Worker> make_worker() {
  if (mpi_thread_level() == MPI_THREAD_MULTIPLE) return std::make_shared<Worker>();
  static std::mutex mu;
  static std::weak_ptr<Worker> shared;
  std::lock_guard lock(mu);
  auto w = shared.lock();
  if (!w) shared = w = std::make_shared<Worker>();
  return w;
}

// Runs `fn` on `worker` and waits for it, rethrowing its exception.
void run_on(Worker& worker, std::function<void()> fn) {
  auto state = std::make_shared<Handle::State>();
  worker.post([state, fn = std::move(fn)] {
    try {
      fn();
      state->finish(nullptr);
    } catch (...) {
      state->finish(std::current_exception());
    }
  });
  Handle(state).wait();
}

void set_errors_return(MPI_Comm comm) {
  DTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
}

Span span_of(const Tensor& t) {
  return {static_cast<char*>(t.raw()), static_cast<size_t>(t.numel()), t.dtype()};
}

int int_count(const Tensor& t, const char* op) {
  DTRAIN_CHECK(t.numel() <= INT_MAX, "{}: {} elements exceed an MPI count", op, t.numel());
  return static_cast<int>(t.numel());
}

// Everything the worker touches; tasks hold it by shared_ptr so an abandoned
// worker never outlives its data.
struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  WorldOptions options;
  OpCounter counter;
  std::vector<char> scratch;
  // Node groups (hierarchical all-reduce), built on first use.
  MPI_Comm intra = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  Topology topo;
  int min_local = 0, max_local = 0;

  void all_reduce(Span buf, ReduceOp op, AllreduceAlgo algo);
  void build_nodes();
  void free_comms();
};

void CommState::build_nodes() {
  if (intra != MPI_COMM_NULL) return;
  if (options.ranks_per_node) {
    int world_rank = 0;
    DTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    DTRAIN_MPI_CHECK(MPI_Comm_split(comm, world_rank / *options.ranks_per_node, rank, &intra));
  } else {
    DTRAIN_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &intra));
  }
  set_errors_return(intra);
  int local = 0, local_size = 1;
  DTRAIN_MPI_CHECK(MPI_Comm_rank(intra, &local));
  DTRAIN_MPI_CHECK(MPI_Comm_size(intra, &local_size));
  DTRAIN_MPI_CHECK(MPI_Comm_split(comm, local, rank, &cross));
  set_errors_return(cross);
  int sizes[2] = {local_size, -local_size}, leaders = local == 0 ? 1 : 0;
  DTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm));
  DTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &leaders, 1, MPI_INT, MPI_SUM, comm));
  max_local = sizes[0];
  min_local = -sizes[1];
  topo = {leaders, min_local == max_local ? max_local : 0};
}

void CommState::all_reduce(Span buf, ReduceOp op, AllreduceAlgo algo) {
  switch (algo) {
    case AllreduceAlgo::native:
      return native_allreduce(comm, buf, op);
    case AllreduceAlgo::ring:
      return RingAllreduce(comm, scratch).run(buf, op);
    case AllreduceAlgo::hierarchical:
      build_nodes();
      if (topo.ranks_per_node == 0) {
        throw Error(fmt::format("comm.ranks_per_node: the nodes of this {}-rank group hold "
                                "between {} and {} ranks; hierarchical all-reduce needs the "
                                "same number on every node",
                                size, min_local, max_local),
                    "set comm.ranks_per_node to a divisor of the world size, or use "
                    "comm.allreduce: ring");
      }
      return HierarchicalAllreduce(intra, cross, scratch).run(buf, op);
    case AllreduceAlgo::auto_:
      break;
  }
  DTRAIN_CHECK(false, "all_reduce(auto) reached the communicator");
}

void CommState::free_comms() {
  for (MPI_Comm* c : {&cross, &intra, &comm}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, WorldOptions options, std::shared_ptr<Worker> worker)
      : s_(std::make_shared<CommState>()), worker_(std::move(worker)) {
    s_->comm = comm;
    s_->options = options;
    run_on(*worker_, [s = s_] {
      set_errors_return(s->comm);
      DTRAIN_MPI_CHECK(MPI_Comm_rank(s->comm, &s->rank));
      DTRAIN_MPI_CHECK(MPI_Comm_size(s->comm, &s->size));
      s->counter.set_ranks(s->size);
    });
  }
  ~MpiCommunicator() override {
    if (std::uncaught_exceptions() > 0) {
      g_skip_finalize = true;
      worker_->abandon();
      return;
    }
    try {
      run_on(*worker_, [s = s_] { s->free_comms(); });
    } catch (...) {  // nothing to do about a failed free while tearing down
    }
  }

  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }
  std::string_view backend() const override { return "mpi"; }

  Handle all_reduce_async(Tensor buf, ReduceOp op, AllreduceAlgo algo) override {
    DTRAIN_CHECK(algo != AllreduceAlgo::auto_, "all_reduce(auto) must be resolved by the caller");
    check_comm_buffer(buf, "all_reduce");
    return enqueue(all_reduce_name(algo, op), buf.nbytes(),
                   [buf, op, algo](CommState& s) { s.all_reduce(span_of(buf), op, algo); });
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  Handle all_gather_async(Tensor in, Tensor out) override;
  Handle all_to_all_async(Tensor in, Tensor out) override;
  void broadcast(Tensor& buf, int root) override;
  Handle reduce_async(Tensor buf, int root) override;
  Handle all_gatherv_async(Tensor buf, std::vector<int64_t> counts) override;
  void send(const Tensor& buf, int peer) override;
  void recv(Tensor& buf, int peer) override;
  void exchange(const std::vector<PeerOp>& ops) override;
  void barrier() override {
    enqueue("barrier", 0, [](CommState& s) { DTRAIN_MPI_CHECK(MPI_Barrier(s.comm)); }).wait();
  }
  std::unique_ptr<Communicator> split(int color, int key) override;
  Topology topology() override {
    enqueue("topology", 0, [](CommState& s) { s.build_nodes(); }).wait();
    return s_->topo;
  }
  void set_ranks_per_node(std::optional<int> n) override {
    if (n && *n <= 0) {
      throw Error(
          fmt::format("comm.ranks_per_node is {}; it must be a positive number of ranks", *n));
    }
    run_on(*worker_, [s = s_, n] {
      DTRAIN_CHECK(s->intra == MPI_COMM_NULL, "ranks_per_node set after the nodes were built");
      s->options.ranks_per_node = n;
    });
  }
  CommStats stats() const override { return s_->counter.stats(); }
  OpRecord last_op() const override { return s_->counter.last(); }
  OpRecord oldest_pending() const override { return s_->counter.oldest_pending(); }

 private:
  static constexpr int kPointToPointTag = 30000;  // apart from the ring's small step tags

  // Issue order = queue order = sequence numbers, even with several issuing threads.
  Handle enqueue(std::string op, size_t bytes, std::function<void(CommState&)> fn) {
    std::lock_guard lock(issue_mu_);
    s_->counter.issue(std::move(op), bytes);
    auto state = std::make_shared<Handle::State>();
    worker_->post([s = s_, state, fn = std::move(fn)]() mutable {
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr error;
      try {
        fn(*s);
      } catch (...) {
        error = std::current_exception();
      }
      // The operation's tensors go before the waiter wakes: a buffer the caller frees
      // after wait() is then free when it returns, not some time later on this thread
      // (which made measured peaks vary from run to run).
      fn = nullptr;
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      s->counter.finished(seconds);
      {
        std::lock_guard lock(state->mu);
        state->timing = {std::chrono::duration<double>(t0.time_since_epoch()).count(), seconds};
      }
      state->finish(error);
    });
    return Handle(state);
  }
  void check_peer(int peer) const {
    DTRAIN_CHECK(peer >= 0 && peer < s_->size && peer != s_->rank, "peer {} of rank {} in {}", peer,
                 s_->rank, s_->size);
  }

  std::shared_ptr<CommState> s_;
  std::shared_ptr<Worker> worker_;
  std::mutex issue_mu_;
};

void MpiCommunicator::reduce_scatter(const Tensor& in, Tensor& out) {
  check_comm_buffer(in, "reduce_scatter");
  check_comm_buffer(out, "reduce_scatter");
  DTRAIN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * s_->size,
               "reduce_scatter: {} -> {} over {} ranks", in.str(), out.str(), s_->size);
  const int n = int_count(out, "reduce_scatter");
  enqueue("reduce_scatter", in.nbytes(), [in, out, n](CommState& s) {
    DTRAIN_MPI_CHECK(
        MPI_Reduce_scatter_block(in.raw(), out.raw(), n, mpi_type(in.dtype()), MPI_SUM, s.comm));
  }).wait();
}

Handle MpiCommunicator::all_gather_async(Tensor in, Tensor out) {
  check_comm_buffer(in, "all_gather");
  check_comm_buffer(out, "all_gather");
  DTRAIN_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * s_->size,
               "all_gather: {} -> {} over {} ranks", in.str(), out.str(), s_->size);
  const int n = int_count(in, "all_gather");
  // In place: `in` is this rank's block of `out` (MPI forbids aliased buffers otherwise).
  const bool in_place = static_cast<const char*>(in.raw()) ==
                        static_cast<const char*>(out.raw()) + in.nbytes() * s_->rank;
  return enqueue("all_gather", out.nbytes(), [in, out, n, in_place](CommState& s) {
    const MPI_Datatype t = mpi_type(in.dtype());
    DTRAIN_MPI_CHECK(
        MPI_Allgather(in_place ? MPI_IN_PLACE : in.raw(), n, t, out.raw(), n, t, s.comm));
  });
}

Handle MpiCommunicator::all_to_all_async(Tensor in, Tensor out) {
  check_comm_buffer(in, "all_to_all");
  check_comm_buffer(out, "all_to_all");
  DTRAIN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() &&
                   out.numel() % s_->size == 0 && in.raw() != out.raw(),
               "all_to_all: {} -> {} over {} ranks (equal, separate buffers)", in.str(), out.str(),
               s_->size);
  const int n = int_count(in, "all_to_all") / s_->size;
  return enqueue("all_to_all", out.nbytes(), [in, out, n](CommState& s) {
    const MPI_Datatype t = mpi_type(in.dtype());
    DTRAIN_MPI_CHECK(MPI_Alltoall(in.raw(), n, t, out.raw(), n, t, s.comm));
  });
}

void MpiCommunicator::broadcast(Tensor& buf, int root) {
  check_comm_buffer(buf, "broadcast");
  DTRAIN_CHECK(root >= 0 && root < s_->size, "broadcast root {} of {}", root, s_->size);
  const int n = int_count(buf, "broadcast");
  enqueue("broadcast", buf.nbytes(), [buf, n, root](CommState& s) {
    DTRAIN_MPI_CHECK(MPI_Bcast(buf.raw(), n, mpi_type(buf.dtype()), root, s.comm));
  }).wait();
}

Handle MpiCommunicator::reduce_async(Tensor buf, int root) {
  check_comm_buffer(buf, "reduce");
  DTRAIN_CHECK(root >= 0 && root < s_->size, "reduce root {} of {}", root, s_->size);
  const int n = int_count(buf, "reduce");
  const bool mine = root == s_->rank;
  return enqueue("reduce", buf.nbytes(), [buf, n, root, mine](CommState& s) {
    const MPI_Datatype t = mpi_type(buf.dtype());
    DTRAIN_MPI_CHECK(MPI_Reduce(mine ? MPI_IN_PLACE : buf.raw(), mine ? buf.raw() : nullptr, n, t,
                                MPI_SUM, root, s.comm));
  });
}

Handle MpiCommunicator::all_gatherv_async(Tensor buf, std::vector<int64_t> counts) {
  DTRAIN_CHECK(buf.defined() && buf.device().is_cpu(), "all_gatherv: {} (the host's buffers)",
               buf.str());
  DTRAIN_CHECK(static_cast<int>(counts.size()) == s_->size, "all_gatherv: {} counts for {} ranks",
               counts.size(), s_->size);
  std::vector<int> n(counts.size()), at(counts.size());
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    DTRAIN_CHECK(counts[r] >= 0 && total + counts[r] <= INT_MAX, "all_gatherv: count {} at {}",
                 counts[r], total);
    n[r] = static_cast<int>(counts[r]);
    at[r] = static_cast<int>(total);
    total += counts[r];
  }
  DTRAIN_CHECK(total == buf.numel(), "all_gatherv: counts sum to {} for {}", total, buf.str());
  // Pure movement: a half buffer travels as 16-bit integers.
  const DType d = buf.dtype();
  const MPI_Datatype t = d == DType::f16 || d == DType::bf16 ? MPI_UINT16_T : mpi_type(d);
  return enqueue("all_gather", buf.nbytes(), [buf, n, at, t](CommState& s) {
    DTRAIN_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.raw(), n.data(),
                                    at.data(), t, s.comm));
  });
}

void MpiCommunicator::send(const Tensor& buf, int peer) {
  check_comm_buffer(buf, "send");
  check_peer(peer);
  const int n = int_count(buf, "send");
  enqueue("send", buf.nbytes(), [buf, n, peer](CommState& s) {
    DTRAIN_MPI_CHECK(MPI_Send(buf.raw(), n, mpi_type(buf.dtype()), peer, kPointToPointTag, s.comm));
  }).wait();
}

void MpiCommunicator::recv(Tensor& buf, int peer) {
  check_comm_buffer(buf, "recv");
  check_peer(peer);
  const int n = int_count(buf, "recv");
  enqueue("recv", buf.nbytes(), [buf, n, peer](CommState& s) {
    DTRAIN_MPI_CHECK(MPI_Recv(buf.raw(), n, mpi_type(buf.dtype()), peer, kPointToPointTag, s.comm,
                              MPI_STATUS_IGNORE));
  }).wait();
}

void MpiCommunicator::exchange(const std::vector<PeerOp>& ops) {
  size_t bytes = 0;
  for (const PeerOp& o : ops) {
    check_peer(o.peer);
    DTRAIN_CHECK(o.buf.defined() && o.buf.device().is_cpu(), "exchange: {}", o.buf.str());
    DTRAIN_CHECK(o.buf.nbytes() <= static_cast<size_t>(INT_MAX),
                 "exchange: {} bytes exceed an MPI count", o.buf.nbytes());
    bytes += o.buf.nbytes();
  }
  if (ops.empty()) return;
  enqueue("exchange", bytes, [ops](CommState& s) {
    std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < ops.size(); ++i) {
      const PeerOp& o = ops[i];
      const int n = static_cast<int>(o.buf.nbytes());
      if (o.send) {
        DTRAIN_MPI_CHECK(
            MPI_Isend(o.buf.raw(), n, MPI_BYTE, o.peer, kPointToPointTag, s.comm, &reqs[i]));
      } else {
        DTRAIN_MPI_CHECK(
            MPI_Irecv(o.buf.raw(), n, MPI_BYTE, o.peer, kPointToPointTag, s.comm, &reqs[i]));
      }
    }
    DTRAIN_MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }).wait();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  DTRAIN_CHECK(color >= 0, "split colour {} (every rank joins a group)", color);
  MPI_Comm child = MPI_COMM_NULL;
  enqueue("split", 0, [&child, color, key](CommState& s) {
    DTRAIN_MPI_CHECK(MPI_Comm_split(s.comm, color, key, &child));
  }).wait();
  return std::make_unique<MpiCommunicator>(child, s_->options, make_worker());
}

}  // namespace

std::unique_ptr<Communicator> make_world_communicator(const WorldOptions& options) {
  check_world_options(options);
  if (!started_by_mpi_launcher()) return make_self_communicator();
  auto worker = make_worker();
  MPI_Comm comm = MPI_COMM_NULL;
  run_on(*worker, [&comm] { DTRAIN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm)); });
  return std::make_unique<MpiCommunicator>(comm, options, std::move(worker));
}

}  // namespace dtrain::dist
