// Launcher environment variables (see launcher.h).
#include "dist/launcher.h"

#include <sched.h>
#include <algorithm>

#include <cstdlib>
#include <string>
#include <thread>

namespace dtrain::dist {

namespace {
std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 1'000'000) return std::nullopt;
  return static_cast<int>(n);
}
}  // namespace

std::optional<int> launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (auto n = env_int(name)) return n;
  }
  return std::nullopt;
}

bool started_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (auto r = env_int(name)) return *r;
  }
  return 0;
}

std::optional<int> launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (auto r = env_int(name)) return r;
  }
  return std::nullopt;
}

std::optional<int> launcher_local_size() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (auto n = env_int(name); n && *n > 0) return n;
  }
  // This job step's tasks per node ("2", "2(x3)", "2,1": this node's is not told apart),
  // before the allocation's, which a step may use only part of.
  if (const char* v = std::getenv("SLURM_STEP_TASKS_PER_NODE")) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != v && n > 0 && n <= 1'000'000) return static_cast<int>(n);
  }
  if (auto n = env_int("SLURM_NTASKS_PER_NODE"); n && *n > 0) return n;
  return std::nullopt;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::optional<RankThreads> threads_per_rank(int cpus) {
  const char* set = std::getenv("OMP_NUM_THREADS");
  if (set != nullptr && *set != '\0') return std::nullopt;
  const int local = launcher_local_size().value_or(1);
  if (local <= 1) return std::nullopt;
  // --cpus-per-task describes srun's tasks: under mpirun inside an allocation it is the
  // allocation's task, not each MPI rank's.
  const bool srun_task = std::getenv("SLURM_STEP_ID") != nullptr &&
                         std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE") == nullptr;
  if (auto c = env_int("SLURM_CPUS_PER_TASK"); srun_task && c && *c > 0)
    return RankThreads{std::min(*c, std::max(1, cpus)), "SLURM_CPUS_PER_TASK"};
  return RankThreads{std::max(1, cpus / local), "a share of the cores"};
}

}  // namespace dtrain::dist
