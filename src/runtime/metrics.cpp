// JSON-lines metrics and the console progress line.
#include "runtime/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>

#include "core/error.h"
#include "data/atomic_file.h"

namespace dtrain::runtime {

void keep_jsonl_through(const std::filesystem::path& file, int64_t keep_through) {
  std::ifstream in(file);
  if (!in) return;
  std::string line, kept;
  bool changed = false;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= keep_through) {
      kept += line + "\n";
    } else {
      changed = true;
    }
  }
  in.close();
  if (changed) write_file_atomic(file.string(), {kept});
}

MetricsLog::MetricsLog(const std::filesystem::path& file, int64_t keep_through) : file_(file) {
  if (keep_through >= 0) keep_jsonl_through(file, keep_through);
  f_ = std::fopen(file.c_str(), keep_through >= 0 ? "a" : "w");
  if (f_ == nullptr) {
    throw Error(
        fmt::format("{}: cannot open the metrics file: {}", file.string(), std::strerror(errno)),
        "check run.output_dir");
  }
}

MetricsLog::~MetricsLog() {
  if (f_ != nullptr) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& line) {
  const std::string text = line.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), f_) != text.size() || std::fflush(f_) != 0) {
    throw Error(fmt::format("{}: write failed: {}", file_.string(), std::strerror(errno)),
                "check the disk space of run.output_dir");
  }
}

RankLog::RankLog(const std::filesystem::path& file, bool append) {
  f_ = std::fopen(file.c_str(), append ? "a" : "w");
  if (f_ == nullptr) {
    throw Error(
        fmt::format("{}: cannot open the rank's log: {}", file.string(), std::strerror(errno)),
        "check run.output_dir");
  }
}

RankLog::~RankLog() {
  if (f_ != nullptr) std::fclose(f_);
}

// A full disk must not stop training over a log line: the write is best effort.
void RankLog::write(const std::string& line) {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::fprintf(f_, "%s %s\n", stamp, line.c_str());
  std::fflush(f_);
}

Progress::Progress(std::FILE* out) : out_(out), tty_(isatty(fileno(out)) != 0) {}

void Progress::update(const std::string& line) {
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    pending_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void Progress::print(const std::string& line) {
  if (pending_) std::fputc('\n', out_);
  pending_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (pending_) std::fputc('\n', out_);
  pending_ = false;
  std::fflush(out_);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace dtrain::runtime
