// Launcher environment variables.
#include "cli/launcher.h"

#include <cstdlib>

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

}  // namespace dtrain::cli
