// The job-file layer: YAML text + --set overrides -> a checked, fully resolved Job,
// and back to YAML. Every user mistake is a dtrain::Error whose message starts
// with file:line:col (or the --set that caused it) and the key path.
// This is the only module that knows YAML exists; nothing here runs a job.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/job.h"
#include "runtime/plan.h"

namespace dtrain::config {

inline constexpr size_t kMaxFileBytes = size_t{1} << 20;  // checked before reading
inline constexpr int kMaxDepth = 32;                      // nesting of maps and lists

struct ValidateContext {
  int world_size = 1;
  // For commands that read a job's model and data but train nothing (generate): the
  // world is the job's own (tensor x pipeline x parallel.data, 1 when unset) instead of
  // world_size, and only the model, data and precision are checked (not train.*,
  // optimizer.*, the grid, batches, comm, compression or memory).
  bool model_only = false;
  std::vector<std::string>* warnings = nullptr;  // non-fatal findings; dropped when null
};

// Where a value came from: a file position (1-based) or an override ("--set a.b=1", line 0).
struct SourceLoc {
  std::string origin;
  int line = 0;
  int col = 0;
  std::string str() const;  // "job.yaml:12:9" or "--set a.b=1"
};

// Key path ("optimizer.lr", "" for the whole document) -> where it was written.
using SourceMap = std::map<std::string, SourceLoc, std::less<>>;

// `where`, when given, receives where each key was written (for located_error).
Job load_job_file(const std::string& path, const std::vector<std::string>& overrides,
                  const ValidateContext& ctx, SourceMap* where = nullptr);
Job load_job_text(std::string_view text, std::string_view filename,
                  const std::vector<std::string>& overrides, const ValidateContext& ctx,
                  SourceMap* where = nullptr);

// Runs `work` (a command's steps after its job loaded); an Error whose message starts
// with a key the job file (or a --set) wrote, "model.num_classes: ...", comes out with
// that key's position in front, "job.yaml:4:16: model.num_classes: ...", as the loader's
// own refusals do. A RunError stays one (exit 3); other exceptions pass unchanged.
void located_errors(const SourceMap& where, const std::function<void()>& work);

// Checks the combinations a single key cannot (batch divisibility, world size, ...).
// `where` only improves the messages; without it they name the key alone.
void validate_job(const Job& job, const ValidateContext& ctx, const SourceMap* where = nullptr);

// Every key in schema order with its resolved value; loads back to the same Job.
std::string dump_job_yaml(const Job& job);

// A cluster file for `dtrain plan` (config/cluster.cpp has the format).
runtime::Cluster load_cluster_file(const std::string& path);

}  // namespace dtrain::config
