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
// The ranks on this machine: OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
// SLURM_NTASKS_PER_NODE or the first count of SLURM_STEP_TASKS_PER_NODE ("2(x3)"),
// the first one set; unset: none.
std::optional<int> launcher_local_size();

// OpenMP threads for one of `local` ranks on a machine of `cores` cores when
// OMP_NUM_THREADS is not set: SLURM's --cpus-per-task (SLURM_CPUS_PER_TASK) when set,
// else an equal share of the cores, at least 1. Several ranks that each start a pool as
// wide as the machine make a step many times slower. nullopt: leave OpenMP's default
// (OMP_NUM_THREADS is set, or this is the only rank here).
struct RankThreads {
  int threads = 1;
  const char* source = "";  // "SLURM_CPUS_PER_TASK" or "a share of the cores"
};
std::optional<RankThreads> threads_per_rank(int cores);

}  // namespace dtrain::dist
