// See kernels/trace.h: without CUDA there is no NVTX, and nothing to mark.
#include "kernels/trace.h"

namespace dtrain::kernels {

void trace_range_push(const std::string&) {}
void trace_range_pop() {}

}  // namespace dtrain::kernels
