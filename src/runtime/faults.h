// Fault injection for the tests of "no hang, nothing lost": DTRAIN_TEST_FAULT=
// "<rank>:<step>:<mode>" makes that rank end after finishing that step, in one of
// the ways a real rank dies — exit0 (early, cleanly), exit1, abort, kill (SIGKILL
// to itself) or hang (sleeps forever). Unset, it does nothing. Not a user feature.
#pragma once

#include <string>
#include <string_view>

#include <cstdint>
#include <vector>

namespace dtrain::runtime {

// Reads DTRAIN_TEST_FAULT once; a malformed value is an Error naming it.
class FaultInjector {
 public:
  explicit FaultInjector(int rank);
  void after_step(int64_t step) const;  // ends the process when the fault is due here

 private:
  enum class Mode : uint8_t { none, exit0, exit1, abort, kill, hang };
  Mode mode_ = Mode::none;
  int64_t step_ = -1;
};

// Save-crash injection for the sharded-checkpoint tests: DTRAIN_TEST_SAVE_FAULT=
// "<rank>:<step>:<phase>" ends that rank with exit status 1 when the save of `step`
// reaches `phase`: "shard" (before writing its shard), "written" (its shard on disk,
// before the ranks compare notes), "manifest" (rank 0: the manifest written, before
// the rename), "renamed" (rank 0: after the rename). "diverge" ends nothing: that rank
// changes one bit of a replicated parameter before the save's replica checks, which
// must then stop every rank; where no other rank holds that parameter (one rank, or
// ZeRO's shards without tensor parallelism) nothing can notice, and the save goes on
// with the changed bit. Unset, it does nothing. Not a user feature.
class SaveFaultInjector {
 public:
  explicit SaveFaultInjector(int rank);  // a malformed value is an Error naming it
  void at(int64_t step, std::string_view phase) const;
  bool diverges(int64_t step) const { return step == step_ && phase_ == "diverge"; }

 private:
  int64_t step_ = -1;
  std::string phase_;
};

// Overflow injection for the loss-scaler tests: DTRAIN_TEST_OVERFLOW=
// "<rank|*>:<step>[,<step>...]" writes +inf into the gradient of the model's last
// parameter (the first gradient backward finishes, before its bucket is sent) on
// that rank (or every rank) in each listed step (numbered from 1, as in metrics).
// Unset, it does nothing. Not a user feature.
class OverflowInjector {
 public:
  explicit OverflowInjector(int rank);  // a malformed value is an Error naming it
  bool due(int64_t step) const;         // inject in the step that becomes `step`

 private:
  std::vector<int64_t> steps_;
};

}  // namespace dtrain::runtime
