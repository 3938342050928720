// Launcher environment variables and the exec of mpirun for --nproc.
#include "cli/launcher.h"

#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "dist/launcher.h"
#include "dist/mpi_info.h"

extern char** environ;

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

int run_and_wait(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], nullptr, nullptr, cargv.data(), environ);
  if (rc != 0) {
    throw Error(fmt::format("cannot run {}: {}", argv[0], std::strerror(rc)),
                "install openmpi-bin (mpirun), or start the ranks with your own launcher");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw RunError(fmt::format("waitpid: {}", std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int run_ranks(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  sigset_t stops, before;
  sigemptyset(&stops);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&stops, s);
  // Blocked from before the fork, so a signal in between waits for sigtimedwait below.
  if (pthread_sigmask(SIG_BLOCK, &stops, &before) != 0)
    throw RunError("--nproc: cannot block the stop signals");
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw RunError(fmt::format("--nproc: fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    sigprocmask(SIG_SETMASK, &before, nullptr);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // both sides, whichever runs first
  int forwarded = 0, status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      pthread_sigmask(SIG_SETMASK, &before, nullptr);
      throw RunError(fmt::format("waitpid: {}", std::strerror(errno)));
    }
    const timespec tick{0, 50'000'000};
    siginfo_t info{};
    const int sig = sigtimedwait(&stops, &info, &tick);
    if (sig <= 0) continue;
    std::fprintf(stderr,
                 forwarded == 0
                     ? "dtrain: %s: the ranks stop at their next step with a checkpoint (again: "
                       "stop at once)\n"
                     : "dtrain: %s again: the ranks stop at once\n",
                 strsignal(sig));
    kill(pid, forwarded++ == 0 ? SIGUSR1 : SIGTERM);
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && forwarded == 0) {
    throw Error(fmt::format("--nproc: cannot run {}", argv[0]),
                "install openmpi-bin (mpirun), or start the ranks with your own launcher");
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::vector<std::string> local_mpirun(int nproc, const std::string& what) {
  if (dist::launcher_world_size().value_or(1) > 1) {
    throw Error("--nproc: this process already runs under a launcher as one of several ranks",
                "drop --nproc under mpirun or srun");
  }
  if (!dist::query_mpi().built) {
    throw Error(fmt::format("--nproc {}: this dtrain was built without MPI, which starts and "
                            "connects the ranks",
                            nproc),
                fmt::format("install Open MPI (scripts/install-deps.sh) and rebuild with "
                            "-DDTRAIN_MPI=ON, or drop --nproc to {} in one process",
                            what));
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // --stdin none: mpirun reads no terminal (run_ranks puts it in a background group).
  std::vector<std::string> argv = {mpirun_path(), "-np", std::to_string(nproc), "--bind-to", "none",
                                   "--stdin",     "none"};
  if (nproc > cores) argv.push_back("--oversubscribe");
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  const char* threads = std::getenv("OMP_NUM_THREADS");
  argv.insert(argv.end(), {"-x", fmt::format("OMP_NUM_THREADS={}",
                                             threads != nullptr && *threads != '\0'
                                                 ? std::string(threads)
                                                 : std::to_string(std::max(1, cores / nproc)))});
  if (nproc > cores) argv.insert(argv.end(), {"-x", "OMP_WAIT_POLICY=passive"});
  return argv;
}

}  // namespace dtrain::cli
