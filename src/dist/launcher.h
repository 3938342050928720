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
// The ranks on this machine: OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, the first
// count of SLURM_STEP_TASKS_PER_NODE ("2(x3)") or SLURM_NTASKS_PER_NODE, the first one
// set; unset: none.
std::optional<int> launcher_local_size();
// The CPUs this process may run on (its affinity mask: a cgroup's or srun's binding),
// not the machine's count.
int usable_cpus();

// OpenMP threads for one of the launcher's local ranks, given the `cpus` this process
// may use, when OMP_NUM_THREADS is not set: SLURM's --cpus-per-task
// (SLURM_CPUS_PER_TASK, in an srun step and not under mpirun) when set, else an equal
// share of the CPUs; at least 1 and at most `cpus`. Several ranks that each start a pool
// as wide as the machine make a step many times slower. nullopt: leave OpenMP's default
// (OMP_NUM_THREADS is set, or this is the only rank here).
struct RankThreads {
  int threads = 1;
  const char* source = "";  // "SLURM_CPUS_PER_TASK" or "a share of the cores"
};
std::optional<RankThreads> threads_per_rank(int cpus);

}  // namespace dtrain::dist
