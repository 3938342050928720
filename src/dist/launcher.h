// What the launcher (mpirun, srun) told this process through its environment,
// read without touching MPI: whether one started it and the world size it set.
#pragma once

#include <optional>

namespace dtrain::dist {

// OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS, the first one set; unset: none.
std::optional<int> launcher_world_size();
// True when an MPI launcher (Open MPI's, a PMI or PMIx one) started this process.
bool started_by_mpi_launcher();
// OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID, the first one set, else 0: for
// naming the rank in messages before MPI is up.
int launcher_rank();
// The rank's index among the ranks on its machine: OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID or SLURM_LOCALID, the first one set (picks a GPU per rank).
std::optional<int> launcher_local_rank();

}  // namespace dtrain::dist
