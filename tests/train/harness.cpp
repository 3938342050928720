// The trainer tests' process, file and checkpoint helpers (harness.h). The
// child is started with posix_spawn so that the tests can signal it by pid;
// its output goes to a file rather than a pipe so nothing can block on a full pipe.
#include "harness.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "../data/image_folder_writer.h"
#include "runtime/checkpoint.h"
#include "runtime/train_state.h"

extern char** environ;

namespace dtrain::train_test {

TempDir::TempDir(const std::string& name) {
  path_ =
      fs::temp_directory_path() / ("dtrain-train-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  if (std::getenv("DTRAIN_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
}

std::string RunResult::describe() const {
  return "dtrain exited with " + std::to_string(rc) + "; its output:\n" + log;
}

namespace {

// The binary under test: the build's, or $DTRAIN_EXE (a build carried to another
// machine, e.g. by scripts/gpu-check.sh, where the build path does not exist).
std::string dtrain_exe() {
  const char* env = std::getenv("DTRAIN_EXE");
  return env && *env ? env : DTRAIN_EXE;
}

// `dtrain <args...>`: the subcommand is args[0].
pid_t spawn_command(const std::vector<std::string>& args, const fs::path& log_file) {
  const std::string exe = dtrain_exe();
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Spinning OpenMP threads on a busy machine slow every parallel region many
  // times over; passive waiting changes no result. An explicit setting wins.
  ::setenv("OMP_WAIT_POLICY", "passive", 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + exe + " failed");
  return pid;
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

pid_t spawn_dtrain(const std::vector<std::string>& args, const fs::path& log_file) {
  std::vector<std::string> train_args = {"train"};
  train_args.insert(train_args.end(), args.begin(), args.end());
  return spawn_command(train_args, log_file);
}

bool still_running(pid_t pid) {
  siginfo_t info{};
  // WNOWAIT: look without reaping, so wait_dtrain still gets the status.
  return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == 0;
}

RunResult wait_dtrain(pid_t pid, const fs::path& log_file, int timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return {decode_status(status), read_bytes(log_file)};
}

RunResult run_dtrain(const std::vector<std::string>& args, const fs::path& log_file,
                     int timeout_s) {
  return wait_dtrain(spawn_dtrain(args, log_file), log_file, timeout_s);
}

RunResult run_dtrain_command(const std::vector<std::string>& args, const fs::path& log_file,
                             int timeout_s) {
  return wait_dtrain(spawn_command(args, log_file), log_file, timeout_s);
}

fs::path write_job(const fs::path& dir, const std::string& run) {
  const fs::path job = dir / (run + ".yaml");
  std::ofstream(job) << "run: {output_dir: " << (dir / run).string() << ", seed: 1}\n"
                     << "model: {arch: resnet18, stem: small, width: 0.125}\n"
                     << "data: {dataset: fashion-mnist, global_batch: 32, workers: 1,\n"
                     << "       limit: {train: 200, test: 64}}\n"
                     << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                     << "train: {steps: 8, log_every: 1}\n"
                     << "logging: {console: false}\n";
  return job;
}

fs::path write_image_folder_job(const fs::path& dir) {
  dtrain::test::write_image_folder(dir / "images", {"red", "green", "blue"},
                                   {{"train", 10}, {"val", 4}});
  const fs::path job = dir / "job.yaml";
  std::ofstream(job) << "run: {seed: 3}\n"
                     << "model: {arch: resnet18, stem: small, width: 0.125, image_size: 24,\n"
                     << "        num_classes: 3}\n"
                     << "data: {dataset: image-folder, path: " << (dir / "images").string()
                     << ", global_batch: 8, workers: 2}\n"
                     << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                     << "train: {steps: 8, log_every: 1, eval_every: 4, checkpoint: {every: 4}}\n"
                     << "logging: {console: false}\n";
  return job;
}

double summary_value(const fs::path& run_dir, const std::string& key) {
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("summary", false)) return j.value(key, 0.0);
  }
  return 0;
}

std::vector<StepLoss> read_losses(const fs::path& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  std::vector<StepLoss> out;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss"))
      out.push_back({j.at("step").get<int64_t>(), j.at("loss").get<double>()});
  }
  return out;
}

nlohmann::json last_eval(const fs::path& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  nlohmann::json out;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("eval", false)) out = std::move(j);
  }
  return out;
}

std::vector<double> eval_losses(const fs::path& metrics_jsonl, const std::string& weights) {
  std::ifstream in(metrics_jsonl);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("eval", false) && j.value("weights", std::string()) == weights)
      out.push_back(j.at("test_loss").get<double>());
  }
  return out;
}

size_t count_lines(const fs::path& file) {
  std::ifstream in(file);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_bytes(e.path());
  }
  return out;
}

std::string changed_files(const std::map<std::string, std::string>& before,
                          const std::map<std::string, std::string>& after) {
  std::string out;
  for (const auto& [name, bytes] : before) {
    const auto it = after.find(name);
    if (it == after.end()) out += name + " removed; ";
    if (it != after.end() && it->second != bytes) out += name + " changed; ";
  }
  for (const auto& [name, bytes] : after) {
    if (!before.contains(name)) out += name + " added; ";
  }
  return out;
}

fs::path newest_checkpoint(const fs::path& ckpt_dir) {
  const auto all = runtime::list_checkpoints(ckpt_dir);
  return all.empty() ? fs::path() : all.back();
}

int64_t checkpoint_step(const fs::path& file) {
  if (file.empty()) return -1;
  return runtime::read_any_checkpoint(file).meta.at("step").get<int64_t>();
}

std::string compare_checkpoints(const fs::path& a, const fs::path& b) {
  const runtime::Checkpoint ca = runtime::read_any_checkpoint(a),
                            cb = runtime::read_any_checkpoint(b);
  for (const char* key : {"step", "data_position", "seed", "loss_scaler"}) {
    if (ca.meta.value(key, nlohmann::json()) != cb.meta.value(key, nlohmann::json())) {
      return std::string("meta.") + key + " differs";
    }
  }
  return compare_checkpoint_state(a, b);
}

namespace {

// Empty when both lists hold the same tensors in the same order, bit for bit.
std::string same_tensors(const std::vector<const runtime::NamedTensor*>& ta,
                         const std::vector<const runtime::NamedTensor*>& tb) {
  if (ta.size() != tb.size()) return "different tensor counts";
  for (size_t i = 0; i < ta.size(); ++i) {
    const runtime::NamedTensor &x = *ta[i], &y = *tb[i];
    if (x.name != y.name || x.tensor.str() != y.tensor.str()) {
      return x.name + " (" + x.tensor.str() + ") vs " + y.name + " (" + y.tensor.str() + ")";
    }
    if (std::memcmp(x.tensor.raw(), y.tensor.raw(), x.tensor.nbytes()) != 0) {
      return "tensor " + x.name + " differs";
    }
  }
  return "";
}

}  // namespace

std::string compare_checkpoint_state(const fs::path& a, const fs::path& b) {
  const runtime::Checkpoint ca = runtime::read_any_checkpoint(a),
                            cb = runtime::read_any_checkpoint(b);
  for (const char* key : {"optimizer", "params", "buffers"}) {
    if (ca.meta.value(key, nlohmann::json()) != cb.meta.value(key, nlohmann::json())) {
      return std::string("meta.") + key + " differs";
    }
  }
  // Gradient compression's state ("compress.*": residuals, PowerSGD's Q) is compared
  // when both runs kept one; a compressed run against a plain one compares the model.
  auto compressed = [](const runtime::Checkpoint& c) {
    for (const runtime::NamedTensor& t : c.tensors)
      if (t.name.rfind("compress.", 0) == 0) return true;
    return false;
  };
  const bool both = compressed(ca) && compressed(cb);
  auto kept = [&](const runtime::Checkpoint& c) {
    std::vector<const runtime::NamedTensor*> out;
    for (const runtime::NamedTensor& t : c.tensors)
      if (both || t.name.rfind("compress.", 0) != 0) out.push_back(&t);
    return out;
  };
  const std::string model = same_tensors(kept(ca), kept(cb));
  if (!model.empty() || !runtime::is_sharded_checkpoint(a) || !runtime::is_sharded_checkpoint(b))
    return model;
  // A sharded checkpoint's own blobs per rank (compression's residual, rank 0's Q) are
  // not in the consolidated form: compared shard by shard where both hold them.
  auto own = [](const fs::path& dir) {  // shard file name -> its compress.* blobs
    std::map<std::string, runtime::Checkpoint> out;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("rank-", 0) != 0) continue;
      runtime::Checkpoint c = runtime::read_checkpoint_blobs(
          e.path(), [](const std::string& blob) { return blob.rfind("compress.", 0) == 0; });
      if (!c.tensors.empty()) out.emplace(name, std::move(c));
    }
    return out;
  };
  const auto oa = own(a), ob = own(b);
  if (oa.empty() || ob.empty()) return "";
  if (oa.size() != ob.size()) return "the compression state of different shard counts";
  for (const auto& [name, sa] : oa) {
    const auto it = ob.find(name);
    if (it == ob.end()) return name + "'s compression state is missing in " + b.string();
    std::vector<const runtime::NamedTensor*> xa, xb;
    for (const runtime::NamedTensor& t : sa.tensors) xa.push_back(&t);
    for (const runtime::NamedTensor& t : it->second.tensors) xb.push_back(&t);
    const std::string diff = same_tensors(xa, xb);
    if (!diff.empty()) return name + ": " + diff;
  }
  return "";
}

std::string checkpoints_within(const fs::path& a, const fs::path& b, double tol) {
  const runtime::Checkpoint ca = runtime::read_any_checkpoint(a),
                            cb = runtime::read_any_checkpoint(b);
  for (const char* key : {"step", "data_position", "params"}) {
    if (ca.meta.value(key, nlohmann::json()) != cb.meta.value(key, nlohmann::json())) {
      return std::string("meta.") + key + " differs";
    }
  }
  if (ca.tensors.size() != cb.tensors.size()) return "different tensor counts";
  for (size_t i = 0; i < ca.tensors.size(); ++i) {
    const runtime::NamedTensor &x = ca.tensors[i], &y = cb.tensors[i];
    if (x.name != y.name || x.tensor.str() != y.tensor.str()) {
      return x.name + " (" + x.tensor.str() + ") vs " + y.name + " (" + y.tensor.str() + ")";
    }
    if (x.tensor.dtype() != DType::f32) {
      if (std::memcmp(x.tensor.raw(), y.tensor.raw(), x.tensor.nbytes()) != 0)
        return "tensor " + x.name + " differs";
      continue;
    }
    double diff = 0, scale = 1e-6;
    for (int64_t k = 0; k < x.tensor.numel(); ++k) {
      const double u = x.tensor.data<float>()[k], v = y.tensor.data<float>()[k];
      diff = std::max(diff, std::fabs(u - v));
      scale = std::max(scale, std::fabs(u));
    }
    if (!(diff <= tol * scale)) {
      return fmt::format("tensor {}: max difference {:.3e} against max magnitude {:.3e}", x.name,
                         diff, scale);
    }
  }
  return "";
}

std::string first_far(const std::vector<StepLoss>& ref, const std::vector<StepLoss>& other,
                      double first_tol, double rest_tol) {
  if (other.empty() || other.size() > ref.size()) {
    return fmt::format("{} steps against a reference of {}", other.size(), ref.size());
  }
  for (size_t i = 0; i < other.size(); ++i) {
    const double tol = (i == 0 ? first_tol : rest_tol) * std::max(1.0, std::abs(ref[i].loss));
    const double gap = std::abs(other[i].loss - ref[i].loss);
    if (ref[i].step != other[i].step || !(gap <= tol)) {
      return fmt::format("step {}: {} vs {} ({:.1e} apart, tolerance {:.1e})", other[i].step,
                         ref[i].loss, other[i].loss, gap, tol);
    }
  }
  return "";
}

std::string first_difference(const std::vector<StepLoss>& a, const std::vector<StepLoss>& b) {
  std::ostringstream s;
  s.precision(17);
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].step != b[i].step ||
        std::bit_cast<uint64_t>(a[i].loss) != std::bit_cast<uint64_t>(b[i].loss)) {
      s << "line " << i << ": step " << a[i].step << " loss " << a[i].loss << " vs step "
        << b[i].step << " loss " << b[i].loss;
      return s.str();
    }
  }
  if (a.size() != b.size()) s << a.size() << " vs " << b.size() << " train lines";
  return s.str();
}

}  // namespace dtrain::train_test
