// Run metrics: one JSON object per line in <output_dir>/metrics.jsonl (train
// log lines, eval lines, the final summary), and a console progress line that
// rewrites itself on a terminal and degrades to plain lines otherwise.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

namespace dtrain::runtime {

class MetricsLog {
 public:
  // Appends when resuming (`append`), else starts the file afresh.
  MetricsLog(const std::filesystem::path& file, bool append);
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
