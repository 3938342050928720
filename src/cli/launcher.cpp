// Launcher environment variables and the exec of mpirun for --nproc.
#include "cli/launcher.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace dtrain::cli {

int world_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (*end != '\0' || n < 1 || n > 1 << 24) {
      throw Error(fmt::format("{}={} is not a positive rank count", name, value),
                  "unset it, or pass --world N");
    }
    return static_cast<int>(n);
  }
  return 1;
}

std::string mpirun_path() {
#ifdef DTRAIN_MPIEXEC
  if (std::filesystem::exists(DTRAIN_MPIEXEC)) return DTRAIN_MPIEXEC;
  return "mpirun";
#else
  throw Error("--nproc: dtrain was built without MPI, so it cannot start several ranks",
              "install libopenmpi-dev and rebuild with -DDTRAIN_MPI=ON");
#endif
}

std::string self_executable() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw RunError(fmt::format("cannot resolve /proc/self/exe: {}", ec.message()));
  return p.string();
}

void exec_or_throw(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(nullptr);
  execvp(cargv[0], cargv.data());
  throw Error(fmt::format("--nproc: cannot run {}: {}", argv[0], std::strerror(errno)),
              "install openmpi-bin (mpirun), or start the ranks with your own launcher");
}

}  // namespace dtrain::cli
