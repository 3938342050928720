// Which MPI library this build talks to (for `dtrain info`), queried without
// initialising MPI. Built from mpi_info.cpp with DTRAIN_MPI, else the stub.
#pragma once

#include <string>

namespace dtrain::dist {

struct MpiInfo {
  bool built = false;               // built with DTRAIN_MPI
  std::string library;              // MPI_Get_library_version's first line, or why there is none
  int version = 0, subversion = 0;  // the MPI standard version the library implements
};

MpiInfo query_mpi();

}  // namespace dtrain::dist
