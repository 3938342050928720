// Stub for builds without CUDA and NCCL: a GPU job across ranks says how to get them.
#include <fmt/format.h>

#include "core/error.h"
#include "dist/communicator.h"

namespace dtrain::dist {

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, Device device,
                                                     std::optional<int>) {
  throw Error(fmt::format("comm.backend: nccl (for {}) needs a dtrain built with CUDA and NCCL",
                          device.str()),
              "rebuild with -DDTRAIN_CUDA=ON on a machine with nvcc and NCCL, or set device: cpu");
}

}  // namespace dtrain::dist
