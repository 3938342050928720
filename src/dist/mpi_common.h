// MPI helpers shared by the MPI backend files (built only with DTRAIN_MPI):
// the checked-call macro and dtype -> MPI datatype. Include only from mpi_*.cpp.
#pragma once

#include <mpi.h>

#include "core/dtype.h"
#include "dist/communicator.h"

namespace dtrain::dist {

// Throws RunError naming the call and MPI_Error_string: an MPI failure is not bad input.
void mpi_failed(int code, const char* call, const char* file, int line);
MPI_Datatype mpi_type(DType dtype);
MPI_Op mpi_op(ReduceOp op);

}  // namespace dtrain::dist

#define DTRAIN_MPI_CHECK(call)                                               \
  do {                                                                       \
    const int dtrain_mpi_rc_ = (call);                                       \
    if (dtrain_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                        \
      ::dtrain::dist::mpi_failed(dtrain_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)
