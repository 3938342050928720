// TensorBoard event files, written without TensorFlow or protobuf: TFRecord framing
// (length, masked CRC-32C of the length, payload, masked CRC-32C of the payload) of
// Event messages encoded by hand (wall_time, step, file_version, or a Summary of
// scalar values: tag and simple_value), the format tensorboard's own reader takes.
// One file per run segment, <dir>/events.out.tfevents.<unix time>.<host>.<pid>; a
// resumed run first cuts the events after its checkpoint's step out of the files
// already there, so no step appears twice.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::runtime {

class EventWriter {
 public:
  // A new event file in `dir`. `keep_through` >= 0 (a resume from that step): every
  // event file already in `dir` keeps only its events up to that step (rewritten
  // atomically; a torn last record from a crash goes too).
  EventWriter(const std::filesystem::path& dir, int64_t keep_through);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event at `step` holding a scalar per (tag, value); flushed at once.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::filesystem::path& file() const { return file_; }

 private:
  void record(const std::string& event);
  std::FILE* f_ = nullptr;
  std::filesystem::path file_;
};

// The framed records of an event file, payloads in order. Stops at a torn or corrupt
// record; `intact` (if given) says whether the whole file was read.
std::vector<std::string> read_event_records(const std::filesystem::path& file,
                                            bool* intact = nullptr);
// The step field of an encoded Event (0 when absent, as protobuf's default).
int64_t event_step(std::string_view event);
// TFRecord's masked CRC-32C.
uint32_t masked_crc32c(const void* data, size_t bytes);

}  // namespace dtrain::runtime
