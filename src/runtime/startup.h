// Start-up agreement across ranks: every rank checks its job, data and
// checkpoint before the first collective of training, then all ranks agree on
// one status, so a rank that cannot start never leaves the others waiting in a
// collective. The failing rank reports; the others end quietly with its code.
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

// Runs `work`, then agrees with every rank of `comm`: when every rank succeeded,
// returns; else rethrows this rank's error (only on the lowest failing rank when
// every rank failed, which is the same job error everywhere) or throws PeerFailed.
void agree_on_startup(dist::Communicator& comm, const std::function<void()>& work);

// The exit code README documents for an exception escaping dtrain (2 bad input,
// 3 cannot run here, 1 internal).
int exit_code_of(const std::exception& e);

}  // namespace dtrain::runtime
