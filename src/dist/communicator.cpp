// Handle, the op counter and the self communicator (a group of one rank: every
// collective is the identity or a copy). The MPI backend is mpi_communicator.cpp.
#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "dist/comm_internal.h"
#include "kernels/memory.h"

namespace dtrain::dist {

void Handle::State::finish(std::exception_ptr e) {
  {
    std::lock_guard lock(mu);
    error = std::move(e);
    done = true;
  }
  cv.notify_all();
}

Handle::Timing Handle::timing() const {
  DTRAIN_CHECK(state_ != nullptr, "timing() on an empty Handle");
  std::lock_guard lock(state_->mu);
  return state_->timing;
}

void Handle::wait() {
  DTRAIN_CHECK(state_ != nullptr, "wait() on an empty Handle");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
  std::function<void()> after = std::move(state_->after_wait);
  state_->after_wait = nullptr;
  lock.unlock();
  if (after) after();
}

bool Handle::test() {
  DTRAIN_CHECK(state_ != nullptr, "test() on an empty Handle");
  std::lock_guard lock(state_->mu);
  if (state_->done && state_->error) std::rethrow_exception(state_->error);
  return state_->done;
}

Handle completed_handle() {
  auto state = std::make_shared<Handle::State>();
  state->done = true;
  return Handle(std::move(state));
}

uint64_t OpCounter::issue(std::string op, size_t bytes) {
  std::lock_guard lock(mu_);
  stats_.calls += 1;
  stats_.bytes += bytes;
  const double n = ranks_, share = n > 1 ? (n - 1) / n : 0.0;
  const bool all_reduce = op.rfind("all_reduce", 0) == 0;
  const bool collective = op == "reduce" || op == "reduce_scatter" || op == "all_gather" ||
                          op == "all_to_all" || op == "broadcast";
  stats_.bus_bytes += static_cast<double>(bytes) * (all_reduce   ? 2 * share
                                                    : collective ? share
                                                                 : 0.0);
  last_ = OpRecord{stats_.calls, std::move(op), bytes};
  pending_.push_back(last_);
  return stats_.calls;
}

void OpCounter::finished(double seconds) {
  std::lock_guard lock(mu_);
  stats_.seconds += seconds;
  stats_.completed += 1;
  if (!pending_.empty()) pending_.pop_front();
}

CommStats OpCounter::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

OpRecord OpCounter::last() const {
  std::lock_guard lock(mu_);
  return last_;
}

OpRecord OpCounter::oldest_pending() const {
  std::lock_guard lock(mu_);
  return pending_.empty() ? OpRecord{} : pending_.front();
}

void check_comm_buffer(const Tensor& t, const char* op) {
  DTRAIN_CHECK(t.defined(), "{}: undefined buffer", op);
  DTRAIN_CHECK(t.device().is_cpu(), "{}: buffer on {}, the host communicator needs the host", op,
               t.device().str());
  const DType d = t.dtype();
  DTRAIN_CHECK(d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64,
               "{}: {} buffers are not supported (f32, f64, i32, i64)", op, dtype_name(d));
}

void check_world_options(const WorldOptions& options) {
  if (options.ranks_per_node && *options.ranks_per_node <= 0) {
    throw Error(fmt::format("comm.ranks_per_node is {}; it must be a positive number of ranks",
                            *options.ranks_per_node),
                "leave it unset to group ranks by the machine they run on");
  }
}

std::string all_reduce_name(AllreduceAlgo algo, ReduceOp op) {
  const std::string suffix = op == ReduceOp::max ? ",max" : "";
  return "all_reduce(" + std::string(to_string(algo)) + suffix + ")";
}

namespace {

// The self communicator takes buffers on any one device (a GPU job at world 1 syncs
// its gradients through it too): every operation is the identity or a copy.
void check_self_buffer(const Tensor& t, const char* op) {
  DTRAIN_CHECK(t.defined(), "{}: undefined buffer", op);
  const DType d = t.dtype();
  DTRAIN_CHECK(d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64 ||
                   d == DType::f16 || d == DType::bf16,
               "{}: {} buffers are not supported", op, dtype_name(d));
}

void copy_bytes(const Tensor& in, Tensor& out) {
  if (in.nbytes() == 0 || in.raw() == out.raw()) return;
  if (in.device().is_cpu() && out.device().is_cpu()) {
    std::memmove(out.raw(), in.raw(), in.nbytes());
  } else {
    kernels::copy(in, out);
  }
}

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "self"; }

  Handle all_reduce_async(Tensor buf, ReduceOp op, AllreduceAlgo algo) override {
    DTRAIN_CHECK(algo != AllreduceAlgo::auto_, "all_reduce(auto) must be resolved by the caller");
    check_self_buffer(buf, "all_reduce");
    count(all_reduce_name(algo, op), buf.nbytes());
    return completed_handle();
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_same(in, out, "reduce_scatter");
    count("reduce_scatter", in.nbytes());
    copy_bytes(in, out);
  }
  Handle all_gather_async(Tensor in, Tensor out) override {
    check_same(in, out, "all_gather");
    count("all_gather", out.nbytes());
    copy_bytes(in, out);
    return completed_handle();
  }
  Handle all_to_all_async(Tensor in, Tensor out) override {
    check_same(in, out, "all_to_all");
    count("all_to_all", out.nbytes());
    copy_bytes(in, out);
    return completed_handle();
  }
  void broadcast(Tensor& buf, int root) override {
    check_self_buffer(buf, "broadcast");
    DTRAIN_CHECK(root == 0, "broadcast root {} in a group of one", root);
    count("broadcast", buf.nbytes());
  }
  Handle all_gatherv_async(Tensor buf, std::vector<int64_t> counts) override {
    check_self_buffer(buf, "all_gatherv");
    DTRAIN_CHECK(counts.size() == 1 && counts[0] == buf.numel(), "all_gatherv: {} for {}",
                 counts.size() == 1 ? counts[0] : -1, buf.str());
    count("all_gather", buf.nbytes());
    return completed_handle();
  }
  Handle reduce_async(Tensor buf, int root) override {
    check_self_buffer(buf, "reduce");
    DTRAIN_CHECK(root == 0, "reduce root {} in a group of one", root);
    count("reduce", buf.nbytes());
    return completed_handle();
  }
  void send(const Tensor&, int peer) override {
    DTRAIN_CHECK(false, "send to rank {} in a group of one (self)", peer);
  }
  void recv(Tensor&, int peer) override {
    DTRAIN_CHECK(false, "recv from rank {} in a group of one (self)", peer);
  }
  void exchange(const std::vector<PeerOp>& ops) override {
    DTRAIN_CHECK(ops.empty(), "exchange with rank {} in a group of one (self)", ops.front().peer);
  }
  void barrier() override { count("barrier", 0); }
  std::unique_ptr<Communicator> split(int, int) override {
    count("split", 0);
    return std::make_unique<SelfCommunicator>();
  }
  Topology topology() override { return {}; }
  void set_ranks_per_node(std::optional<int>) override {}
  CommStats stats() const override { return counter_.stats(); }
  OpRecord last_op() const override { return counter_.last(); }
  OpRecord oldest_pending() const override { return counter_.oldest_pending(); }

 private:
  static void check_same(const Tensor& in, const Tensor& out, const char* op) {
    check_self_buffer(in, op);
    check_self_buffer(out, op);
    DTRAIN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(), "{}: {} -> {}", op,
                 in.str(), out.str());
  }

  void count(std::string op, size_t bytes) {
    counter_.issue(std::move(op), bytes);
    counter_.finished(0.0);
  }

  OpCounter counter_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() {
  return std::make_unique<SelfCommunicator>();
}

}  // namespace dtrain::dist
