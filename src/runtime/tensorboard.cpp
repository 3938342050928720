// See tensorboard.h. The messages (tensorflow/core/util/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// encoded as protobuf's wire format: a key varint (field << 3 | wire type), then a
// varint (type 0), 8 little-endian bytes (1), a length and bytes (2) or 4 bytes (5).
#include "runtime/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/checksum.h"
#include "core/error.h"
#include "data/atomic_file.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "events.out.tfevents.";

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_bytes(std::string& out, int field, std::string_view b) {
  put_key(out, field, 2);
  put_varint(out, b.size());
  out.append(b);
}

// An Event's wall_time (now) and step.
std::string event_head(int64_t step) {
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  uint64_t bits;
  std::memcpy(&bits, &wall, sizeof bits);
  std::string e;
  put_key(e, 1, 1);
  put_le(e, bits, 8);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

std::string frame(const std::string& payload) {
  std::string r;
  put_le(r, payload.size(), 8);
  put_le(r, masked_crc32c(r.data(), 8), 4);
  r += payload;
  put_le(r, masked_crc32c(payload.data(), payload.size()), 4);
  return r;
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool get_varint(std::string_view s, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && at < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// events.out.tfevents.<seconds>.<host>.<pid>
fs::path new_file_name(const fs::path& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  const fs::path base = dir / fmt::format("{}{}.{}.{}", kPrefix, secs, host, getpid());
  fs::path name = base;
  for (int i = 1; fs::exists(name); ++i) name = base.string() + "." + std::to_string(i);
  return name;  // .1, .2, ...: a second writer in the same second and process sorts after
}

// Cuts the events after `step` (and a torn tail) out of the event files in `dir`.
void trim_event_files(const fs::path& dir, int64_t step) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || e.path().filename().string().rfind(kPrefix, 0) != 0) continue;
    bool intact = true;
    const std::vector<std::string> records = read_event_records(e.path(), &intact);
    std::string kept;
    size_t n = 0;
    for (const std::string& r : records) {
      if (event_step(r) > step) continue;
      kept += frame(r);
      ++n;
    }
    if (n == records.size() && intact) continue;
    write_file_atomic(e.path().string(), {kept});
  }
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

int64_t event_step(std::string_view event) {
  size_t at = 0;
  while (at < event.size()) {
    uint64_t key = 0, v = 0;
    if (!get_varint(event, at, key)) return 0;
    switch (key & 7) {
      case 0:
        if (!get_varint(event, at, v)) return 0;
        if ((key >> 3) == 2) return static_cast<int64_t>(v);
        break;
      case 1:
        at += 8;
        break;
      case 2:
        if (!get_varint(event, at, v)) return 0;
        at += v;
        break;
      case 5:
        at += 4;
        break;
      default:
        return 0;
    }
  }
  return 0;
}

std::vector<std::string> read_event_records(const fs::path& file, bool* intact) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  bool whole = true;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12 ||
        get_le(bytes.data() + at + 8, 4) != masked_crc32c(bytes.data() + at, 8)) {
      whole = false;
      break;
    }
    const uint64_t len = get_le(bytes.data() + at, 8);
    if (bytes.size() - at - 12 < len + 4 ||
        get_le(bytes.data() + at + 12 + len, 4) != masked_crc32c(bytes.data() + at + 12, len)) {
      whole = false;
      break;
    }
    out.emplace_back(bytes.data() + at + 12, len);
    at += 12 + len + 4;
  }
  if (intact) *intact = whole;
  return out;
}

EventWriter::EventWriter(const fs::path& dir, int64_t keep_through) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (keep_through >= 0) trim_event_files(dir, keep_through);
  file_ = new_file_name(dir);
  f_ = std::fopen(file_.c_str(), "wb");
  if (f_ == nullptr) {
    throw Error(fmt::format("{}: cannot open the TensorBoard event file: {}", file_.string(),
                            std::strerror(errno)),
                "check run.output_dir, or set logging.tensorboard: false");
  }
  std::string e = event_head(0);
  put_bytes(e, 3, "brain.Event:2");
  record(e);
}

EventWriter::~EventWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    const auto f = static_cast<float>(value);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    put_key(v, 2, 5);
    put_le(v, bits, 4);
    put_bytes(summary, 1, v);
  }
  std::string e = event_head(step);
  put_bytes(e, 5, summary);
  record(e);
}

void EventWriter::record(const std::string& event) {
  const std::string r = frame(event);
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size() || std::fflush(f_) != 0) {
    throw Error(fmt::format("{}: write failed: {}", file_.string(), std::strerror(errno)),
                "check the disk space of run.output_dir");
  }
}

}  // namespace dtrain::runtime
