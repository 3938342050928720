// Test harness for the trainer's end-to-end tests: runs the real `dtrain train`
// binary (or another subcommand, e.g. `dtrain data tokenize`) in a child process
// (per-test temporary directory, stdout+stderr captured to a log), reads
// metrics.jsonl and compares checkpoints tensor by tensor. It does not link the
// trainer itself: every test goes through the CLI.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dtrain::train_test {

namespace fs = std::filesystem;

// A fresh, empty directory under the system temp dir, removed on destruction
// unless DTRAIN_KEEP_TEST_DIRS is set (for looking at a failure afterwards).
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct RunResult {
  int rc = -1;      // exit status; 128 + N when killed by signal N
  std::string log;  // stdout and stderr, interleaved
  std::string describe() const;
};

// `dtrain train <args...>`, waiting for it to end (and killing it after
// `timeout_s`, which then fails with rc 128 + SIGKILL).
RunResult run_dtrain(const std::vector<std::string>& args, const fs::path& log_file,
                     int timeout_s = 300);

// The same, but returns at once; finish with wait_dtrain.
pid_t spawn_dtrain(const std::vector<std::string>& args, const fs::path& log_file);
RunResult wait_dtrain(pid_t pid, const fs::path& log_file, int timeout_s = 300);
bool still_running(pid_t pid);  // reaps nothing; false once it has exited

// `dtrain <args...>` for any other subcommand (e.g. {"data", "tokenize", ...}).
RunResult run_dtrain_command(const std::vector<std::string>& args, const fs::path& log_file,
                             int timeout_s = 300);

// The quick job of the trainer's tests (tiny ResNet-18 on a Fashion-MNIST
// slice) written to <dir>/job.yaml with run.output_dir <dir>/<run>. Extra
// settings go through `--set` so each test states what it varies.
fs::path write_job(const fs::path& dir, const std::string& run = "run");
// A 3-class image folder at <dir>/images (blue, green, red: 10 training and 4 evaluation
// PPM images each, of their own sizes) and <dir>/job.yaml, which trains a width-1/8
// ResNet-18 on it at 24 x 24 for 8 steps, evaluating and saving at steps 4 and 8.
fs::path write_image_folder_job(const fs::path& dir);

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One train line of metrics.jsonl.
struct StepLoss {
  int64_t step = 0;
  double loss = 0;
  bool operator==(const StepLoss&) const = default;
};
std::vector<StepLoss> read_losses(const fs::path& metrics_jsonl);
// The last evaluation line of a metrics.jsonl (null when there is none).
nlohmann::json last_eval(const fs::path& metrics_jsonl);
// The test_loss of every eval line of a metrics.jsonl whose "weights" is `weights`
// ("ema": of optimizer.ema's average, or "model"), in order.
std::vector<double> eval_losses(const fs::path& metrics_jsonl, const std::string& weights);
// `key` of the summary line of run_dir/metrics.jsonl (peak_host_bytes, ...); 0 when absent.
double summary_value(const fs::path& run_dir, const std::string& key);
size_t count_lines(const fs::path& file);

std::string read_bytes(const fs::path& file);
void write_bytes(const fs::path& file, const std::string& bytes);

// Every regular file under `dir` (relative path -> contents).
std::map<std::string, std::string> snapshot(const fs::path& dir);
// "job.yaml changed, checkpoints/x added" — empty when the snapshots are equal.
std::string changed_files(const std::map<std::string, std::string>& before,
                          const std::map<std::string, std::string>& after);

// The newest step-*.dtckpt in `ckpt_dir` ("" when none) and its step (-1 when none).
fs::path newest_checkpoint(const fs::path& ckpt_dir);
int64_t checkpoint_step(const fs::path& file);

// Empty when both checkpoints hold the same tensors (names, dtypes, shapes,
// bytes) and the same step and data position; else what differs.
std::string compare_checkpoints(const fs::path& a, const fs::path& b);
// Only the model and optimizer state (tensors and optimizer step), not where the
// run stood: for checking that a skipped step changed nothing. Compression's state
// ("compress.*" blobs; in sharded checkpoints, each rank's shard's) counts only when
// both checkpoints hold it.
std::string compare_checkpoint_state(const fs::path& a, const fs::path& b);

// Checkpoints of the same model and step that need not be bitwise equal (another
// order of the same sums): "" when every tensor x of `a` and its twin y of `b` have
// max|x - y| <= tol * max(max|x|, 1e-6) and the step and data position are equal;
// else the first tensor that is not, with its distance.
std::string checkpoints_within(const fs::path& a, const fs::path& b, double tol);

// "step 3: 2.31 vs 2.30" for the first difference, "" when the lists match bit for bit.
std::string first_difference(const std::vector<StepLoss>& a, const std::vector<StepLoss>& b);

// "step 3: 2.31 vs 2.20 (4.8e-02 relative, tolerance 2.0e-02)" for the first step of
// `other` whose loss is not within tol * max(1, |ref|) of `ref`'s (tol = first_tol on
// the first line, rest_tol after; a non-finite loss is never within), "" when all are.
// `other` may be shorter than `ref` (a shorter run of the same job), not longer or empty.
std::string first_far(const std::vector<StepLoss>& ref, const std::vector<StepLoss>& other,
                      double first_tol, double rest_tol);

}  // namespace dtrain::train_test
