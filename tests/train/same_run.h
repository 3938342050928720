// Shared by the multi-process training tests: one OpenMP thread per process (bitwise
// comparisons need the same kernels' thread split) and the check that two runs logged
// the same losses and ended with the same checkpoint, bit for bit.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>

#include "harness.h"

namespace dtrain::train_test {

struct OneThread {
  OneThread() { setenv("OMP_NUM_THREADS", "1", 1); }
};

inline void require_same(const fs::path& a, const fs::path& b) {
  const auto la = read_losses(a / "metrics.jsonl"), lb = read_losses(b / "metrics.jsonl");
  REQUIRE(!la.empty());
  CHECK_MESSAGE(first_difference(la, lb).empty(), a.filename().string(), " vs ",
                b.filename().string(), ": ", first_difference(la, lb));
  CHECK(compare_checkpoints(newest_checkpoint(a / "checkpoints"),
                            newest_checkpoint(b / "checkpoints")) == "");
}

}  // namespace dtrain::train_test
