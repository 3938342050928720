// What the process launcher (mpirun, srun) tells us through the environment, and
// how `dtrain train --nproc N` runs mpirun.
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
// `dtrain train --nproc N`: mpirun (argv) as a child in a process group of its own, its
// exit status returned. A stop signal to this process (SIGTERM, SIGUSR1, or SIGINT:
// Ctrl-C reaches this process's group, not mpirun's) goes to mpirun as SIGUSR1, which
// mpirun forwards to every rank: they stop at one step with a checkpoint and exit 4, and
// so does this process (mpirun's own SIGTERM or SIGINT handling would end it with 1). A
// second stop signal goes as SIGTERM. Ctrl-Z and fg stop and continue mpirun's group
// with this process. mpirun gets SIGTERM if this process dies.
struct RanksOptions {
  // The ranks' word that they stop (runtime::TrainRequest::stop_file, from
  // private_stop_file): while it exists a repeated stop is not sent; when it says
  // "stopped", mpirun's exit 0 becomes ours 4. It and its directory are removed after.
  std::string stop_file;
  // false: the ranks do not stop gracefully (bench): the first stop goes as SIGTERM.
  bool graceful = true;
};
int run_ranks(const std::vector<std::string>& argv, const RanksOptions& options = {});
// A file name in a new directory of this process's own under the temporary directory
// (mkdtemp): no other run, user or PID namespace shares it. Empty when it cannot be made
// (the ranks then exit 4 themselves).
std::string private_stop_file();

// `mpirun -np N` on this machine, up to the program: no binding, one OpenMP thread per
// core share (OMP_NUM_THREADS when set), and when the ranks outnumber the cores
// --oversubscribe and passive waiting (oversubscribed spinning pools run many times
// slower); root allowed. `what` names the command in errors ("train", "bench").
// Errors when this process already runs under a launcher or dtrain lacks MPI.
std::vector<std::string> local_mpirun(int nproc, const std::string& what);

// The OpenMP threads local_mpirun gives each of `local` ranks when OMP_NUM_THREADS is
// not set: a share of the cores.
int local_rank_threads(int local);
// estimate and validate of a `world`-rank job, outside a launcher: this process's
// thread count set to what each of the job's ranks on one machine (`ranks_per_node`,
// else all of them, when they fit the cores) runs under --nproc, so that per-thread
// workspaces are sized as the run sizes them. Returns that count, or 0 where nothing
// changed (one rank here; OMP_NUM_THREADS set; under a launcher, where the rank's own
// count holds; more ranks than cores and no ranks_per_node).
int assume_rank_threads(int world, int ranks_per_node);

}  // namespace dtrain::cli
