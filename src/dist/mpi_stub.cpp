// Stub for builds without MPI: says how to get it. The world is this process
// alone unless a launcher says it started more ranks, which is then an error.
#include <fmt/format.h>

#include "core/error.h"
#include "dist/comm_internal.h"
#include "dist/launcher.h"
#include "dist/mpi_info.h"

namespace dtrain::dist {

MpiInfo query_mpi() {
  return {false, "dtrain was built without MPI; rebuild with -DDTRAIN_MPI=ON", 0, 0};
}

std::unique_ptr<Communicator> make_world_communicator(const WorldOptions& options) {
  check_world_options(options);
  const std::optional<int> world = launcher_world_size();
  if (world && *world > 1) {
    throw Error(fmt::format("the launcher started {} ranks, but dtrain was built without MPI; "
                            "rebuild with -DDTRAIN_MPI=ON",
                            *world),
                "or run a single process");
  }
  return make_self_communicator();
}

}  // namespace dtrain::dist
