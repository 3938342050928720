// Run metrics: one JSON object per line in <output_dir>/metrics.jsonl (train
// log lines, eval lines, the final summary), and a console progress line that
// rewrites itself on a terminal and degrades to plain lines otherwise.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

namespace dtrain::runtime {

// A JSON-lines file of a run (metrics.jsonl, samples.jsonl) kept through `keep_through`:
// the lines whose integer "step" is at most it stay, the rest (a later step, a torn last
// line) go, rewritten atomically when any does; -1 empties it. No file: nothing to do.
void keep_jsonl_through(const std::filesystem::path& file, int64_t keep_through);

class MetricsLog {
 public:
  // keep_through < 0: starts the file afresh. Otherwise (a resume from that step) the
  // file keeps its train and eval lines up to that step, and loses the later ones and
  // the summary (the resumed run writes them again) and a torn last line, then
  // appends: each step is in the file once.
  MetricsLog(const std::filesystem::path& file, int64_t keep_through);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const nlohmann::json& line);  // flushed at once: a crash loses nothing logged

 private:
  std::FILE* f_ = nullptr;
  std::filesystem::path file_;
};

// A rank's own log, <output_dir>/logs/rank-N.log: one time-stamped line per event.
class RankLog {
 public:
  RankLog(const std::filesystem::path& file, bool append);
  ~RankLog();
  RankLog(const RankLog&) = delete;
  RankLog& operator=(const RankLog&) = delete;
  void write(const std::string& line);

 private:
  std::FILE* f_ = nullptr;
};

class Progress {
 public:
  explicit Progress(std::FILE* out);  // a terminal: one line redrawn in place
  void update(const std::string& line);
  void print(const std::string& line);  // a permanent line (eval results, notices)
  void finish();

 private:
  std::FILE* out_;
  bool tty_;
  bool pending_ = false;
};

// "1h02m", "3m07s", "12s"
std::string format_duration(double seconds);

}  // namespace dtrain::runtime
