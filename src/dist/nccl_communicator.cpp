// The NCCL communicator (built with CUDA and NCCL): collectives on one GPU's
// buffers over the ranks of a host communicator, which carries the ncclUniqueId.
// Every operation is issued from the calling thread, in issue order, on this
// communicator's own stream, ordered after the work already queued on the
// device's compute stream by an event (so a gradient is sent when its kernel
// has run, not when it was merely queued). A poller thread watches each
// operation's completion event, times it from its start event, completes its
// Handle, and polls ncclCommGetAsyncError while anything is pending: an
// asynchronous NCCL error (a peer died, a network failure) aborts the
// communicator and fails every pending and later operation with RunError.
// wait() blocks the host until the operation has finished on the device.
//
// Algorithms: native is ncclAllReduce; ring is NCCL's reduce-scatter then
// all-gather (the two phases compression plugs between); hierarchical is a
// reduce-scatter inside the node, an all-reduce of each shard across nodes
// among ranks with the same local index, an all-gather inside the node
// (sub-communicators from ncclCommSplit). Elements past the largest multiple of
// the group size go through ncclAllReduce. Every rank ends with identical bits:
// each element is reduced once and then copied.
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <deque>
#include <functional>
#include <initializer_list>
#include <thread>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
#include "dist/comm_internal.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/memory.h"

namespace dtrain::dist {

namespace {

using kernels::cuda_ops::Context;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    default:
      DTRAIN_CHECK(false, "no NCCL datatype for {}", dtype_name(dtype));
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

// ncclGroupStart ... ncclGroupEnd: end() closes the group (checked); a group left by an
// exception is closed unchecked on the way out, so that the thread is not left in one.
class NcclGroup {
 public:
  NcclGroup() { DTRAIN_NCCL_CHECK(ncclGroupStart()); }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  void end() {
    open_ = false;
    DTRAIN_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

// Operations per NCCL group: NCCL's documentation allows at most 2048 between
// ncclGroupStart and ncclGroupEnd; half of that leaves room. The per-rank loops below
// (all-to-all, all_gatherv) split into groups of this size, which match across ranks.
constexpr int kGroupOps = 1024;

// Sub-communicators for hierarchical all-reduce.
struct Nodes {
  ncclComm_t intra = nullptr, cross = nullptr;
  int local = 0, local_size = 1;
};

// Everything the poller touches; it holds the state by shared_ptr.
struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  cudaStream_t stream = nullptr;  // NCCL's stream
  cudaEvent_t ready = nullptr;    // recorded on the compute stream at each issue
  OpCounter counter;
  std::vector<int> node_of;  // per rank: its node (0, 1, ... by first rank)
  std::optional<int> ranks_per_node;
  Nodes nodes;
  bool nodes_built = false;

  struct Pending {
    cudaEvent_t start = nullptr, done = nullptr;
    std::shared_ptr<Handle::State> state;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> spare;  // events of finished operations, for reuse
  std::exception_ptr failed;       // sticky: set by the poller on an asynchronous error
  // (seq, buffer) of unfinished operations: referenced until the operation is done,
  // released on an issuing or waiting thread (the allocator is the compute thread's).
  std::mutex kept_mu;
  std::deque<std::pair<uint64_t, Tensor>> kept;
  void release_kept() {
    const uint64_t completed = counter.stats().completed;
    std::deque<std::pair<uint64_t, Tensor>> done;
    {
      std::lock_guard lock(kept_mu);
      while (!kept.empty() && kept.front().first <= completed) {
        done.push_back(std::move(kept.front()));
        kept.pop_front();
      }
    }
  }  // `done` freed here, outside the lock
  bool stop = false;
  bool abort_requested = false;  // the owner is unwinding: abort instead of waiting

  cudaEvent_t take_event() {
    {
      std::lock_guard lock(mu);
      if (!spare.empty()) {
        cudaEvent_t e = spare.back();
        spare.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    DTRAIN_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  ncclResult_t async_error() const {
    ncclResult_t worst = ncclSuccess;
    for (ncclComm_t c : {comm, nodes.intra, nodes.cross}) {
      if (c == nullptr) continue;
      ncclResult_t r = ncclSuccess;
      if (ncclCommGetAsyncError(c, &r) != ncclSuccess) return ncclInternalError;
      if (r != ncclSuccess && r != ncclInProgress) worst = r;
    }
    return worst;
  }
  void abort_all() {
    for (ncclComm_t* c : {&nodes.cross, &nodes.intra, &comm}) {
      if (*c != nullptr) ncclCommAbort(*c);
      *c = nullptr;
    }
  }
  void poll();
};

// Runs until stopped with nothing pending: completes operations in issue order.
void NcclState::poll() {
  if (cudaSetDevice(device) != cudaSuccess) return;
  int idle = 0;  // polls of the same unfinished operation: back off from 10 to 200 us
  for (;;) {
    Pending front;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stop || !pending.empty(); });
      if (abort_requested) break;
      if (pending.empty()) return;
      front = pending.front();
    }
    std::exception_ptr error;
    const cudaError_t q = cudaEventQuery(front.done);
    if (q == cudaErrorNotReady) {
      const ncclResult_t r = async_error();
      if (r == ncclSuccess) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::min(10 << std::min(idle, 5), 200)));
        ++idle;
        continue;
      }
      error = std::make_exception_ptr(RunError(
          fmt::format("NCCL reported an asynchronous error on rank {} of {}: {} ({}); a peer "
                      "rank died or the network failed",
                      rank, size, ncclGetErrorString(r), static_cast<int>(r)),
          "see the other ranks' messages and logs/rank-N.log"));
    } else if (q != cudaSuccess) {
      error = std::make_exception_ptr(
          RunError(fmt::format("CUDA failed while an NCCL operation ran on rank {}: {} ({})", rank,
                               cudaGetErrorString(q), static_cast<int>(q))));
    }
    if (error) {  // fail everything: the communicator is unusable
      std::deque<Pending> all;
      {
        std::lock_guard lock(mu);
        failed = error;
        all.swap(pending);
      }
      abort_all();
      for (Pending& p : all) {
        counter.finished(0.0);
        p.state->finish(error);
      }
      continue;
    }
    idle = 0;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, front.start, front.done) != cudaSuccess) ms = 0.0f;
    counter.finished(static_cast<double>(ms) / 1000.0);
    {
      std::lock_guard lock(mu);
      pending.pop_front();
      spare.push_back(front.start);
      spare.push_back(front.done);
    }
    {  // seen done now: it started its device time before
      const double now =
          std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      std::lock_guard lock(front.state->mu);
      front.state->timing = {now - static_cast<double>(ms) / 1000.0,
                             static_cast<double>(ms) / 1000.0};
    }
    front.state->finish(nullptr);
  }
  abort_all();  // only the poller touches the communicators once the owner is gone
  std::lock_guard lock(mu);
  for (Pending& p : pending) p.state->finish(std::make_exception_ptr(RunError("NCCL aborted")));
  pending.clear();
}

int64_t host_hash() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return 0;
  return static_cast<int64_t>(crc32c(name, std::strlen(name), 0));
}

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; `node_of` is each rank's node.
  NcclCommunicator(ncclComm_t comm, int device, std::vector<int> node_of,
                   std::optional<int> ranks_per_node)
      : s_(std::make_shared<NcclState>()) {
    s_->comm = comm;
    s_->device = device;
    s_->node_of = std::move(node_of);
    s_->ranks_per_node = ranks_per_node;
    Context::get(device).activate();
    DTRAIN_NCCL_CHECK(ncclCommUserRank(comm, &s_->rank));
    DTRAIN_NCCL_CHECK(ncclCommCount(comm, &s_->size));
    s_->counter.set_ranks(s_->size);
    DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking));
    DTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&s_->ready, cudaEventDisableTiming));
    poller_ = std::thread([s = s_] { s->poll(); });
  }
  ~NcclCommunicator() override {
    const bool unwinding = std::uncaught_exceptions() > 0;
    {
      std::lock_guard lock(s_->mu);
      s_->stop = true;
      s_->abort_requested = unwinding;
    }
    s_->cv.notify_all();
    const auto drop_kept = [this] {  // on this thread, the allocator's
      std::lock_guard lock(s_->kept_mu);
      s_->kept.clear();
    };
    if (unwinding) {  // a peer may never finish what is pending: the poller aborts
      poller_.detach();
      drop_kept();
      return;
    }
    poller_.join();
    drop_kept();
    for (ncclComm_t c : {s_->nodes.cross, s_->nodes.intra, s_->comm}) {
      if (c != nullptr) ncclCommDestroy(c);
    }
    for (cudaEvent_t e : s_->spare) cudaEventDestroy(e);
    cudaEventDestroy(s_->ready);
    cudaStreamDestroy(s_->stream);
  }

  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }
  std::string_view backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(s_->device); }

  Handle all_reduce_async(Tensor buf, ReduceOp op, AllreduceAlgo algo) override {
    DTRAIN_CHECK(algo != AllreduceAlgo::auto_, "all_reduce(auto) must be resolved by the caller");
    check(buf, "all_reduce", true);
    if (algo == AllreduceAlgo::hierarchical) build_nodes();
    return issue(all_reduce_name(algo, op), buf.nbytes(),
                 [this, buf, op, algo](cudaStream_t st) { run_all_reduce(buf, op, algo, st); },
                 {buf});
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check(in, "reduce_scatter", true);
    check(out, "reduce_scatter", true);
    DTRAIN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * s_->size,
                 "reduce_scatter: {} -> {} over {} ranks", in.str(), out.str(), s_->size);
    issue("reduce_scatter", in.nbytes(), [this, in, out](cudaStream_t st) {
      DTRAIN_NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()),
                                          nccl_type(in.dtype()), ncclSum, s_->comm, st));
    }).wait();
  }
  Handle all_gather_async(Tensor in, Tensor out) override {
    check(in, "all_gather", false);
    check(out, "all_gather", false);
    DTRAIN_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * s_->size,
                 "all_gather: {} -> {} over {} ranks", in.str(), out.str(), s_->size);
    return issue(
        "all_gather", out.nbytes(),
        [this, in, out](cudaStream_t st) {
          DTRAIN_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()),
                                          nccl_type(in.dtype()), s_->comm, st));
        },
        {in, out});
  }
  // One send and one receive per peer (NCCL has no all-to-all collective), in groups of
  // kGroupOps / 2 shifts: at shift d every rank sends to rank + d and receives from
  // rank - d, so each group's sends and receives match within the group.
  Handle all_to_all_async(Tensor in, Tensor out) override {
    check(in, "all_to_all", false);
    check(out, "all_to_all", false);
    DTRAIN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() &&
                     out.numel() % s_->size == 0 && in.raw() != out.raw(),
                 "all_to_all: {} -> {} over {} ranks (equal, separate buffers)", in.str(),
                 out.str(), s_->size);
    return issue("all_to_all", out.nbytes(),
                 [this, in, out](cudaStream_t st) {
                   const int world = s_->size, me = s_->rank;
                   const auto n = static_cast<size_t>(in.numel() / world);
                   const size_t block = n * dtype_size(in.dtype());
                   constexpr int shifts = kGroupOps / 2;
                   for (int first = 0; first < world; first += shifts) {
                     NcclGroup group;
                     for (int d = first; d < std::min(world, first + shifts); ++d) {
                       const int to = (me + d) % world, from = (me - d + world) % world;
                       DTRAIN_NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw()) + to * block,
                                                  n, nccl_type(in.dtype()), to, s_->comm, st));
                       DTRAIN_NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw()) + from * block, n,
                                                  nccl_type(in.dtype()), from, s_->comm, st));
                     }
                     group.end();
                   }
                 },
                 {in, out});
  }
  void broadcast(Tensor& buf, int root) override {
    check(buf, "broadcast", false);
    DTRAIN_CHECK(root >= 0 && root < s_->size, "broadcast root {} of {}", root, s_->size);
    issue("broadcast", buf.nbytes(), [this, buf, root](cudaStream_t st) {
      DTRAIN_NCCL_CHECK(ncclBroadcast(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()),
                                      nccl_type(buf.dtype()), root, s_->comm, st));
    }).wait();
  }
  // One broadcast per rank's block, grouped (kGroupOps ranks to a group; broadcasts are
  // collectives, issued in the same order everywhere): NCCL's all-gather wants equal
  // blocks.
  Handle all_gatherv_async(Tensor buf, std::vector<int64_t> counts) override {
    check(buf, "all_gatherv", false);
    DTRAIN_CHECK(static_cast<int>(counts.size()) == s_->size, "all_gatherv: {} counts for {} ranks",
                 counts.size(), s_->size);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    DTRAIN_CHECK(total == buf.numel(), "all_gatherv: counts sum to {} for {}", total, buf.str());
    return issue(
        "all_gather", buf.nbytes(),
        [this, buf, counts](cudaStream_t st) {
          const size_t elem = dtype_size(buf.dtype());
          int64_t at = 0;
          for (int first = 0; first < s_->size; first += kGroupOps) {
            NcclGroup group;
            for (int r = first; r < std::min(s_->size, first + kGroupOps); ++r) {
              const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
              char* p = static_cast<char*>(buf.raw()) + static_cast<size_t>(at) * elem;
              if (n > 0) {
                DTRAIN_NCCL_CHECK(ncclBroadcast(p, p, n, nccl_type(buf.dtype()), r, s_->comm, st));
              }
              at += static_cast<int64_t>(n);
            }
            group.end();
          }
        },
        {buf});
  }
  Handle reduce_async(Tensor buf, int root) override {
    check(buf, "reduce", false);
    DTRAIN_CHECK(root >= 0 && root < s_->size, "reduce root {} of {}", root, s_->size);
    return issue(
        "reduce", buf.nbytes(),
        [this, buf, root](cudaStream_t st) {
          DTRAIN_NCCL_CHECK(ncclReduce(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()),
                                       nccl_type(buf.dtype()), ncclSum, root, s_->comm, st));
        },
        {buf});
  }
  void send(const Tensor& buf, int peer) override {
    check(buf, "send", false);
    check_peer(peer);
    issue("send", buf.nbytes(), [this, buf, peer](cudaStream_t st) {
      DTRAIN_NCCL_CHECK(ncclSend(buf.raw(), static_cast<size_t>(buf.numel()),
                                 nccl_type(buf.dtype()), peer, s_->comm, st));
    }).wait();
  }
  void recv(Tensor& buf, int peer) override {
    check(buf, "recv", false);
    check_peer(peer);
    issue("recv", buf.nbytes(), [this, buf, peer](cudaStream_t st) {
      DTRAIN_NCCL_CHECK(ncclRecv(buf.raw(), static_cast<size_t>(buf.numel()),
                                 nccl_type(buf.dtype()), peer, s_->comm, st));
    }).wait();
  }
  void exchange(const std::vector<PeerOp>& ops) override {
    size_t bytes = 0;
    for (const PeerOp& o : ops) {
      check(o.buf, "exchange", false);
      check_peer(o.peer);
      bytes += o.buf.nbytes();
    }
    if (ops.empty()) return;
    issue("exchange", bytes, [this, ops](cudaStream_t st) {
      NcclGroup group;
      for (const PeerOp& o : ops) {
        if (o.send) {
          DTRAIN_NCCL_CHECK(ncclSend(o.buf.raw(), o.buf.nbytes(), ncclUint8, o.peer, s_->comm, st));
        } else {
          DTRAIN_NCCL_CHECK(ncclRecv(o.buf.raw(), o.buf.nbytes(), ncclUint8, o.peer, s_->comm, st));
        }
      }
      group.end();
    }).wait();
  }
  void barrier() override {
    Tensor one = Tensor::empty(Shape{1}, DType::i32, &kernels::device_allocator(device()));
    issue("barrier", 0, [this, one](cudaStream_t st) {
      DTRAIN_NCCL_CHECK(ncclAllReduce(one.raw(), one.raw(), 1, ncclInt32, ncclSum, s_->comm, st));
    }).wait();
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    DTRAIN_CHECK(color >= 0, "split colour {} (every rank joins a group)", color);
    check_usable();
    // The child's node map: the ranks of the parent that join it, in (key, rank) order.
    Tensor mine = Tensor::empty(Shape{3}, DType::i64, &kernels::device_allocator(device()));
    Tensor all =
        Tensor::empty(Shape{3 * s_->size}, DType::i64, &kernels::device_allocator(device()));
    Tensor h = Tensor::empty(Shape{3}, DType::i64);
    h.data<int64_t>()[0] = color;
    h.data<int64_t>()[1] = key;
    h.data<int64_t>()[2] = s_->node_of[static_cast<size_t>(s_->rank)];
    kernels::copy(h, mine);
    all_gather(mine, all);
    const Tensor hall = kernels::to_host(all);
    struct Member {
      int64_t key, rank, node;
    };
    std::vector<Member> members;
    for (int r = 0; r < s_->size; ++r) {
      const int64_t* v = hall.data<int64_t>() + 3 * r;
      if (v[0] == color) members.push_back({v[1], r, v[2]});
    }
    std::stable_sort(members.begin(), members.end(),
                     [](const Member& a, const Member& b) { return a.key < b.key; });
    std::vector<int> node_of;
    for (const Member& m : members) node_of.push_back(static_cast<int>(m.node));
    ncclComm_t child = nullptr;
    issue("split", 0, [this, color, key, &child](cudaStream_t) {
      DTRAIN_NCCL_CHECK(ncclCommSplit(s_->comm, color, key, &child, nullptr));
    }).wait();
    return std::make_unique<NcclCommunicator>(child, s_->device, renumber(node_of), std::nullopt);
  }
  Topology topology() override {
    build_nodes();
    return {s_->size / s_->nodes.local_size, s_->nodes.local_size};
  }
  void set_ranks_per_node(std::optional<int> n) override {
    if (n && *n <= 0) {
      throw Error(
          fmt::format("comm.ranks_per_node is {}; it must be a positive number of ranks", *n));
    }
    DTRAIN_CHECK(!s_->nodes_built, "ranks_per_node set after the nodes were built");
    s_->ranks_per_node = n;
  }
  CommStats stats() const override { return s_->counter.stats(); }
  OpRecord last_op() const override { return s_->counter.last(); }
  OpRecord oldest_pending() const override { return s_->counter.oldest_pending(); }

  // Node ids 0, 1, ... in order of each node's first rank.
  static std::vector<int> renumber(const std::vector<int>& raw) {
    std::vector<int> seen, out;
    for (int v : raw) {
      auto it = std::find(seen.begin(), seen.end(), v);
      if (it == seen.end()) {
        seen.push_back(v);
        it = seen.end() - 1;
      }
      out.push_back(static_cast<int>(it - seen.begin()));
    }
    return out;
  }

 private:
  void check(const Tensor& t, const char* op, bool reduce) const {
    DTRAIN_CHECK(t.defined(), "{}: undefined buffer", op);
    DTRAIN_CHECK(t.device() == device(), "{}: buffer on {}, the NCCL communicator is on {}", op,
                 t.device().str(), device().str());
    const DType d = t.dtype();
    DTRAIN_CHECK(d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64 ||
                     d == DType::f16 || d == DType::bf16 || !reduce,
                 "{}: {} buffers are not reduced by NCCL here", op, dtype_name(d));
    (void)nccl_type(d);
  }
  void check_peer(int peer) const {
    DTRAIN_CHECK(peer >= 0 && peer < s_->size && peer != s_->rank, "peer {} of rank {} in {}", peer,
                 s_->rank, s_->size);
  }
  void check_usable() {
    std::lock_guard lock(s_->mu);
    if (s_->failed) std::rethrow_exception(s_->failed);
  }

  // Queues `fn`'s NCCL calls on the communicator's stream after the compute stream's
  // work so far; the poller completes the returned Handle.
  Handle issue(std::string op, size_t bytes, const std::function<void(cudaStream_t)>& fn,
               std::initializer_list<Tensor> keep = {}) {
    std::lock_guard issue_lock(issue_mu_);
    check_usable();
    const cudaStream_t compute = Context::get(s_->device).stream();
    Context::get(s_->device).activate();
    const uint64_t seq = s_->counter.issue(std::move(op), bytes);
    {
      std::lock_guard lock(s_->kept_mu);
      for (const Tensor& t : keep)
        if (t.defined()) s_->kept.emplace_back(seq, t);
    }
    NcclState::Pending p;
    p.state = std::make_shared<Handle::State>();
    // Buffers stay referenced until their operation is done; released at the next
    // issue or when a handle is waited for (a compressed bucket's buffers as its
    // exchange completes, as the memory estimate counts them).
    s_->release_kept();
    p.state->after_wait = [w = std::weak_ptr<NcclState>(s_)] {
      if (const std::shared_ptr<NcclState> s = w.lock()) s->release_kept();
    };
    try {
      p.start = s_->take_event();
      p.done = s_->take_event();
      DTRAIN_CUDA_CHECK(cudaEventRecord(s_->ready, compute));
      DTRAIN_CUDA_CHECK(cudaStreamWaitEvent(s_->stream, s_->ready, 0));
      DTRAIN_CUDA_CHECK(cudaEventRecord(p.start, s_->stream));
      fn(s_->stream);
      DTRAIN_CUDA_CHECK(cudaEventRecord(p.done, s_->stream));
    } catch (...) {
      s_->counter.finished(0.0);
      throw;
    }
    {
      std::lock_guard lock(s_->mu);
      s_->pending.push_back(p);
    }
    s_->cv.notify_all();
    return Handle(p.state);
  }

  void run_all_reduce(const Tensor& buf, ReduceOp op, AllreduceAlgo algo, cudaStream_t st) {
    const ncclDataType_t type = nccl_type(buf.dtype());
    const ncclRedOp_t rop = nccl_op(op);
    char* base = static_cast<char*>(buf.raw());
    const size_t n = static_cast<size_t>(buf.numel()), esize = dtype_size(buf.dtype());
    size_t done = 0;  // elements handled by the two-phase algorithms
    if (algo == AllreduceAlgo::ring && s_->size > 1) {
      const size_t chunk = n / static_cast<size_t>(s_->size);
      if (chunk > 0) {
        char* mine = base + static_cast<size_t>(s_->rank) * chunk * esize;
        DTRAIN_NCCL_CHECK(ncclReduceScatter(base, mine, chunk, type, rop, s_->comm, st));
        DTRAIN_NCCL_CHECK(ncclAllGather(mine, base, chunk, type, s_->comm, st));
        done = chunk * static_cast<size_t>(s_->size);
      }
    } else if (algo == AllreduceAlgo::hierarchical && s_->size > 1) {
      const Nodes& nd = s_->nodes;
      const size_t chunk = n / static_cast<size_t>(nd.local_size);
      if (chunk > 0) {
        char* mine = base + static_cast<size_t>(nd.local) * chunk * esize;
        DTRAIN_NCCL_CHECK(ncclReduceScatter(base, mine, chunk, type, rop, nd.intra, st));
        DTRAIN_NCCL_CHECK(ncclAllReduce(mine, mine, chunk, type, rop, nd.cross, st));
        DTRAIN_NCCL_CHECK(ncclAllGather(mine, base, chunk, type, nd.intra, st));
        done = chunk * static_cast<size_t>(nd.local_size);
      }
    }
    if (done < n) {
      char* tail = base + done * esize;
      DTRAIN_NCCL_CHECK(ncclAllReduce(tail, tail, n - done, type, rop, s_->comm, st));
    }
  }

  // Collective on the first call: the intra-node and cross-node communicators.
  void build_nodes() {
    if (s_->nodes_built) return;
    std::vector<int> node = s_->node_of;
    if (s_->ranks_per_node) {
      for (int r = 0; r < s_->size; ++r) node[static_cast<size_t>(r)] = r / *s_->ranks_per_node;
    }
    const int me = node[static_cast<size_t>(s_->rank)];
    int local = 0, local_size = 0, min_size = INT_MAX, max_size = 0;
    for (int r = 0; r < s_->size; ++r) {
      if (node[static_cast<size_t>(r)] == me) {
        if (r < s_->rank) ++local;
        ++local_size;
      }
    }
    for (int v : std::vector<int>(node)) {
      const auto c = static_cast<int>(std::count(node.begin(), node.end(), v));
      min_size = std::min(min_size, c);
      max_size = std::max(max_size, c);
    }
    if (min_size != max_size) {
      throw Error(fmt::format("comm.ranks_per_node: the nodes of this {}-rank group hold between "
                              "{} and {} ranks; hierarchical all-reduce needs the same number on "
                              "every node",
                              s_->size, min_size, max_size),
                  "set comm.ranks_per_node to a divisor of the world size, or use "
                  "comm.allreduce: ring");
    }
    Nodes nd;
    nd.local = local;
    nd.local_size = local_size;
    issue("split(nodes)", 0, [this, me, local, &nd](cudaStream_t) {
      DTRAIN_NCCL_CHECK(ncclCommSplit(s_->comm, me, s_->rank, &nd.intra, nullptr));
      DTRAIN_NCCL_CHECK(ncclCommSplit(s_->comm, local, s_->rank, &nd.cross, nullptr));
    }).wait();
    s_->nodes = nd;
    s_->nodes_built = true;
  }

  std::shared_ptr<NcclState> s_;
  std::thread poller_;
  std::mutex issue_mu_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, Device device,
                                                     std::optional<int> ranks_per_node) {
  DTRAIN_CHECK(device.is_cuda(), "NCCL communicator on {}", device.str());
  DTRAIN_CHECK(host.device().is_cpu(), "the NCCL id travels over a host communicator");
  check_world_options({ranks_per_node});
  Context::get(device.index).activate();
  // Rank 0's unique id (128 bytes) and every rank's host, over the host communicator.
  ncclUniqueId id{};
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  constexpr int64_t kIdWords = sizeof(ncclUniqueId) / sizeof(int64_t);
  Tensor words = Tensor::empty(Shape{kIdWords}, DType::i64);
  if (host.rank() == 0) {
    DTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(words.raw(), &id, sizeof(id));
  }
  host.broadcast(words, 0);
  std::memcpy(&id, words.raw(), sizeof(id));
  Tensor mine = Tensor::empty(Shape{1}, DType::i64);
  mine.data<int64_t>()[0] = host_hash();
  Tensor hosts = Tensor::empty(Shape{host.size()}, DType::i64);
  host.all_gather(mine, hosts);
  std::vector<int> node_of;
  for (int r = 0; r < host.size(); ++r) {
    node_of.push_back(static_cast<int>(hosts.data<int64_t>()[r] & 0x7fffffff));
  }
  ncclComm_t comm = nullptr;
  DTRAIN_NCCL_CHECK(ncclCommInitRank(&comm, host.size(), id, host.rank()));
  return std::make_unique<NcclCommunicator>(comm, device.index, NcclCommunicator::renumber(node_of),
                                            ranks_per_node);
}

}  // namespace dtrain::dist
