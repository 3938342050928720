// Start-up agreement across ranks: every rank checks its job, data and
// checkpoint before the first collective of training, then all ranks agree on
// one status, so a rank that cannot start never leaves the others waiting in a
// collective. The failing rank reports; the others end quietly with its code. The
// evaluation agrees the same way on each test batch it reads (trainer.cpp).
#pragma once

#include <exception>
#include <functional>

#include "dist/communicator.h"

namespace dtrain::runtime {

// Thrown on a rank that had no error of its own when another rank failed to start:
// the process ends with `code` (the failing rank's exit code) and prints nothing.
struct PeerFailed : std::exception {
  int code = 1;
  int rank = 0;  // the lowest failing rank
  PeerFailed(int c, int r) : code(c), rank(r) {}
  const char* what() const noexcept override { return "another rank failed to start"; }
};

// What the ranks of a communicator agreed after each ran a piece of work: the worst exit
// code (0: every rank succeeded), the lowest failing rank, whether every rank failed,
// and this rank's own error (null where it succeeded).
struct AgreedStatus {
  int code = 0;
  int first = 0;
  bool everyone = false;
  std::exception_ptr error;
  explicit operator bool() const { return code != 0; }
};

// Runs `work`, catching what it throws, then agrees with every rank of `comm` (one small
// all-reduce; none for one rank). Every rank returns the same code, first and everyone.
AgreedStatus agree_status(dist::Communicator& comm, const std::function<void()>& work);

// Ends a failed agreement on this rank: rethrows its own error (with `each`, on every
// failing rank: each read its own files; else only on the lowest failing rank when every
// rank failed, which is the same job error everywhere), else throws PeerFailed.
[[noreturn]] void rethrow_agreed(const AgreedStatus& status, int rank, bool each = false);

// agree_status, then rethrow_agreed when a rank failed: start-up's all-or-nothing.
void agree_on_startup(dist::Communicator& comm, const std::function<void()>& work);

// The exit code README documents for an exception escaping dtrain (2 bad input,
// 3 cannot run here, 1 internal).
int exit_code_of(const std::exception& e);

}  // namespace dtrain::runtime
