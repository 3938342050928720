// Launcher environment variables, and mpirun for --nproc (run_ranks).
#include "cli/launcher.h"

#include <fcntl.h>
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
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/parallel.h"
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

int run_ranks(const std::vector<std::string>& argv, const RanksOptions& options) {
  std::error_code ec;
  const auto stopping = [&] {
    return !options.stop_file.empty() && std::filesystem::exists(options.stop_file, ec);
  };
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  // The stops passed on (SIGINT only when this process heeds it: a shell's `&` leaves it
  // ignored), and job control (Ctrl-Z, fg) passed to mpirun's group.
  struct sigaction current {};
  sigaction(SIGINT, nullptr, &current);
  sigset_t waited, before;
  sigemptyset(&waited);
  for (int s : {SIGTERM, SIGUSR1, SIGTSTP, SIGCONT}) sigaddset(&waited, s);
  if (current.sa_handler != SIG_IGN) sigaddset(&waited, SIGINT);
  signal(SIGCHLD, SIG_DFL);  // an inherited SIG_IGN would reap mpirun before waitpid sees it
  // Blocked from before the fork, so a signal in between waits for sigtimedwait below.
  if (pthread_sigmask(SIG_BLOCK, &waited, &before) != 0)
    throw RunError("--nproc: cannot block the stop signals");
  int exec_error[2];  // the child writes execvp's errno here; closed on a successful exec
  if (pipe2(exec_error, O_CLOEXEC) != 0) {
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw RunError(fmt::format("--nproc: pipe: {}", std::strerror(errno)));
  }
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
    const int e = errno;
    (void)!write(exec_error[1], &e, sizeof(e));
    _exit(127);
  }
  close(exec_error[1]);
  setpgid(pid, pid);  // both sides, whichever runs first
  int e = 0;
  const ssize_t got = read(exec_error[0], &e, sizeof(e));  // 0 bytes: the exec succeeded
  close(exec_error[0]);
  if (got == static_cast<ssize_t>(sizeof(e))) {
    waitpid(pid, nullptr, 0);
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw Error(fmt::format("--nproc: cannot run {}: {}", argv[0], std::strerror(e)),
                "install openmpi-bin (mpirun), or start the ranks with your own launcher");
  }
  int stops = 0, status = 0;
  int ticks_since_stop = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    // A stop mpirun got before its ranks ran reached none of them: it goes again every
    // 2 s until mpirun ends (a rank only records a stop, so a repeat changes nothing).
    if (stops == 1 && ++ticks_since_stop % 40 == 0 && options.graceful && !stopping())
      kill(pid, SIGUSR1);
    if (done < 0 && errno != EINTR) {
      pthread_sigmask(SIG_SETMASK, &before, nullptr);
      throw RunError(fmt::format("waitpid: {}", std::strerror(errno)));
    }
    const timespec tick{0, 50'000'000};
    siginfo_t info{};
    const int sig = sigtimedwait(&waited, &info, &tick);
    if (sig <= 0) continue;
    if (sig == SIGTSTP) {  // Ctrl-Z: mpirun and the ranks stop too, then this process
      kill(-pid, SIGSTOP);
      raise(SIGSTOP);
      continue;
    }
    if (sig == SIGCONT) {  // fg / bg: this process runs again; so do they
      kill(-pid, SIGCONT);
      continue;
    }
    if (!options.graceful) {
      std::fprintf(stderr, "dtrain: %s: the ranks stop\n", strsignal(sig));
      kill(pid, SIGTERM);
      ++stops;
      continue;
    }
    std::fprintf(stderr,
                 stops == 0
                     ? "dtrain: %s: the ranks stop at their next step with a checkpoint (again: "
                       "stop at once)\n"
                     : "dtrain: %s again: the ranks stop at once\n",
                 strsignal(sig));
    kill(pid, stops++ == 0 ? SIGUSR1 : SIGTERM);
  }
  // A stop that came after mpirun's exit is this process's to drop, not to die of.
  const timespec now{0, 0};
  while (sigtimedwait(&waited, nullptr, &now) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  bool stopped = false;
  if (!options.stop_file.empty()) {
    std::string word;
    std::ifstream(options.stop_file) >> word;
    stopped = word == "stopped";
    std::filesystem::remove_all(std::filesystem::path(options.stop_file).parent_path(), ec);
  }
  // A second stop (SIGTERM to mpirun) ends the ranks at once: mpirun exits 1 or 128 + a
  // signal, whether the ranks had saved (the file says "stopped") or not yet (the newest
  // checkpoint is the one before): either way a stop, exit 4, and --resume latest. A
  // rank's own code (2, 3: its message says why) passes through.
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (options.graceful && stops >= 2 && (code == 1 || code > 128)) {
    std::fprintf(stderr,
                 "dtrain: the ranks were stopped at once (mpirun exited with %d)%s; resume with "
                 "--resume latest\n",
                 code,
                 stopped ? " after their checkpoint" : "; the newest checkpoint is the last saved");
    return 4;  // commands.h: kExitInterrupted
  }
  if (WIFEXITED(status)) {
    const int rc = WEXITSTATUS(status);
    if (rc > 128 && rc < 128 + NSIG) {  // mpirun's code for a rank a signal ended
      const int sig = rc - 128;
      // A crash (runtime::report_fatal_signals) named its rank in a line of its own.
      const bool named =
          sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT;
      std::fprintf(stderr,
                   "dtrain: mpirun exited with %d: a rank ended on signal %d (%s)%s, or mpirun "
                   "could not start the ranks (its own report is off here: run mpirun "
                   "yourself to see it)%s\n",
                   rc, sig, strsignal(sig), named ? " (its line above names it)" : "",
                   sig == SIGKILL ? "; SIGKILL is most often the kernel's out-of-memory killer "
                                    "(`dmesg` names what it killed; `dtrain estimate JOB` gives "
                                    "each rank's peak)"
                                  : "");
    }
    return rc == 0 && stopped ? 4 : rc;  // commands.h: kExitInterrupted
  }
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  // mpirun itself died (a signal sent to it rather than to this process, or its own
  // crash while it ended the ranks): the ranks' codes are lost with it.
  std::fprintf(stderr,
               "dtrain: mpirun ended on signal %d (%s) without the ranks' exit codes; the "
               "lines above are the ranks' own (a saved checkpoint is named there). To stop "
               "a run, signal this dtrain process (Ctrl-C, kill): it stops the ranks with a "
               "checkpoint\n",
               sig, strsignal(sig));
  return 128 + sig;
}

std::string private_stop_file() {
  std::string dir = (std::filesystem::temp_directory_path() / "dtrain-launcher-XXXXXX").string();
  // None where the temporary directory is not writable: the ranks then exit 4 themselves
  // (and mpirun prints its banner after them).
  if (mkdtemp(dir.data()) == nullptr) return {};
  return (std::filesystem::path(dir) / "stop").string();
}

int local_rank_threads(int local) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local));
}

int assume_rank_threads(int world, int ranks_per_node) {
  const char* set = std::getenv("OMP_NUM_THREADS");
  if ((set != nullptr && *set != '\0') || dist::launcher_local_size()) return 0;
  // More ranks than cores and no comm.ranks_per_node: a cluster's job, whose ranks per
  // node this machine cannot know.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (ranks_per_node <= 0 && world > cores) return 0;
  const int local = ranks_per_node > 0 ? std::min(world, ranks_per_node) : world;
  if (local <= 1) return 0;
  const int threads = local_rank_threads(local);
  set_num_threads(threads);
  return threads;
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
  // --quiet: no banner after a rank's own error message (exit 2 on bad input); a rank
  // killed by a signal is reported by run_ranks instead.
  std::vector<std::string> argv = {mpirun_path(), "-np",    std::to_string(nproc),
                                   "--bind-to",   "none",   "--stdin",
                                   "none",        "--quiet"};
  if (nproc > cores) argv.push_back("--oversubscribe");
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  const char* threads = std::getenv("OMP_NUM_THREADS");
  argv.insert(argv.end(), {"-x", fmt::format("OMP_NUM_THREADS={}",
                                             threads != nullptr && *threads != '\0'
                                                 ? std::string(threads)
                                                 : std::to_string(local_rank_threads(nproc)))});
  if (nproc > cores) argv.insert(argv.end(), {"-x", "OMP_WAIT_POLICY=passive"});
  return argv;
}

}  // namespace dtrain::cli
