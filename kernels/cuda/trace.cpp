// See kernels/trace.h: NVTX v3 from the CUDA toolkit.
#include <nvtx3/nvToolsExt.h>

#include "kernels/trace.h"

namespace dtrain::kernels {

void trace_range_push(const std::string& name) { nvtxRangePushA(name.c_str()); }
void trace_range_pop() { nvtxRangePop(); }

}  // namespace dtrain::kernels
