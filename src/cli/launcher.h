// What the process launcher (mpirun, srun) tells us through the environment, and
// how `dtrain train --nproc N` becomes mpirun.
#pragma once

#include <string>
#include <vector>

namespace dtrain::cli {

// The rank count a launcher advertises (Open MPI, MPICH/PMI, SLURM), else 1.
// A malformed value is an Error naming the variable.
int world_from_env();

// The mpirun this dtrain was built against (CMake's MPIEXEC_EXECUTABLE), else
// "mpirun" from PATH; an Error when dtrain was built without MPI.
std::string mpirun_path();
std::string self_executable();  // /proc/self/exe, resolved
// execvp(argv); returns only by throwing (an Error naming the program).
[[noreturn]] void exec_or_throw(const std::vector<std::string>& argv);

}  // namespace dtrain::cli
