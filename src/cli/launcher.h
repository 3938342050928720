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
// Runs argv as a child process and waits for it: its exit status, 128 + the signal
// that ended it. An Error naming the program when it cannot start.
int run_and_wait(const std::vector<std::string>& argv);

// `mpirun -np N` on this machine, up to the program: no binding, one OpenMP thread per
// core share (OMP_NUM_THREADS when set), and when the ranks outnumber the cores
// --oversubscribe and passive waiting (oversubscribed spinning pools run many times
// slower); root allowed. `what` names the command in errors ("train", "bench").
// Errors when this process already runs under a launcher or dtrain lacks MPI.
std::vector<std::string> local_mpirun(int nproc, const std::string& what);

}  // namespace dtrain::cli
