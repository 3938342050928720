// The one thread pool: OpenMP's, which oneDNN also uses, so no two pools ever
// spin against each other (shared/PLATFORM.md). parallel_for splits a range in
// fixed chunks of `grain`; a chunk's result never depends on the thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace dtrain {

int num_threads();
void set_num_threads(int n);

// Calls fn(lo, hi) for consecutive chunks [lo, hi) of [begin, end), each at
// most `grain` long, in parallel. Serial when the range is one chunk or we are
// already inside a parallel region.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (end - begin + grain - 1) / grain;
  if (chunks == 1 || omp_in_parallel() || omp_get_max_threads() == 1) {
    for (int64_t c = 0; c < chunks; ++c)
      fn(begin + c * grain, std::min(end, begin + (c + 1) * grain));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    fn(begin + c * grain, std::min(end, begin + (c + 1) * grain));
  }
}

}  // namespace dtrain
