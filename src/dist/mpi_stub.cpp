// Stub for builds without MPI: says how to get it.
#include "dist/mpi_info.h"

namespace dtrain::dist {

MpiInfo query_mpi() {
  return {false, "dtrain was built without MPI; rebuild with -DDTRAIN_MPI=ON", 0, 0};
}

}  // namespace dtrain::dist
