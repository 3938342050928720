// Named ranges for NVIDIA's tools (Nsight Systems): the profiler's spans as NVTX push /
// pop ranges on a CUDA build (nvtx3, header-only: nothing is linked, and the calls cost
// a branch when no tool is attached); no-ops on a build without CUDA.
#pragma once

#include <string>

namespace dtrain::kernels {

void trace_range_push(const std::string& name);
void trace_range_pop();

}  // namespace dtrain::kernels
