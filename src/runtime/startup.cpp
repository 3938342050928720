// Status agreement: one small all-reduce (max of the exit codes, of a "lowest failing
// rank" key and of "a rank succeeded").
#include "runtime/startup.h"

#include "core/error.h"

namespace dtrain::runtime {

int exit_code_of(const std::exception& e) {
  if (dynamic_cast<const RunError*>(&e) != nullptr) return 3;
  if (dynamic_cast<const Error*>(&e) != nullptr) return 2;
  return 1;
}

AgreedStatus agree_status(dist::Communicator& comm, const std::function<void()>& work) {
  AgreedStatus s;
  int code = 0;
  try {
    work();
  } catch (const std::exception& e) {
    code = exit_code_of(e);
    s.error = std::current_exception();
  }
  if (comm.size() == 1) {
    s.code = code;
    s.everyone = code != 0;
    return s;
  }
  const int n = comm.size(), r = comm.rank();
  // One max: [worst code, size - lowest failing rank (max picks the lowest), whether any
  // rank succeeded].
  Tensor v = Tensor::empty(Shape{3}, DType::i64);
  int64_t* x = v.data<int64_t>();
  x[0] = code;
  x[1] = code != 0 ? n - r : 0;
  x[2] = code == 0 ? 1 : 0;
  comm.all_reduce(v, dist::ReduceOp::max);
  s.code = static_cast<int>(x[0]);
  s.first = n - static_cast<int>(x[1]);
  s.everyone = x[2] == 0;
  return s;
}

void rethrow_agreed(const AgreedStatus& s, int rank, bool each) {
  if (s.error && (each || !s.everyone || rank == s.first)) std::rethrow_exception(s.error);
  throw PeerFailed(s.code, s.first);
}

void agree_on_startup(dist::Communicator& comm, const std::function<void()>& work) {
  const AgreedStatus s = agree_status(comm, work);
  if (s) rethrow_agreed(s, comm.rank());
}

}  // namespace dtrain::runtime
