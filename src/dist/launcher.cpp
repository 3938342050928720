// Launcher environment variables (see launcher.h).
#include "dist/launcher.h"

#include <cstdlib>
#include <string>

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

}  // namespace dtrain::dist
