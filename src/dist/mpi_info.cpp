// MPI library identification. MPI_Get_version and MPI_Get_library_version are
// among the few calls the standard allows before MPI_Init.
#include "dist/mpi_info.h"

#include <mpi.h>

#include "core/error.h"

namespace dtrain::dist {

MpiInfo query_mpi() {
  MpiInfo info;
  info.built = true;
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) {
    info.library = "MPI_Get_library_version failed";
    return info;
  }
  std::string lib(text, static_cast<size_t>(std::max(len, 0)));
  info.library = lib.substr(0, lib.find_first_of("\r\n,"));
  if (MPI_Get_version(&info.version, &info.subversion) != MPI_SUCCESS) {
    info.version = info.subversion = 0;
  }
  return info;
}

}  // namespace dtrain::dist
