// The checkpoint file format (little-endian):
//   0   "DTRAINCK"          magic, 8 bytes
//   8   u32 version, u32 header bytes H, u32 CRC-32C of the header, u32 0
//   24  header: JSON {"meta": {...}, "tensors": [{name, dtype, shape, offset, bytes, crc32c}]}
//   ... blobs, each at a 64-byte-aligned offset
//   end "DTRAINEND\0\0\0\0\0\0\0" (16 bytes) so a truncated file is recognised
#include "runtime/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <regex>

#include "core/checksum.h"
#include "data/atomic_file.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
constexpr char kTrailer[16] = {'D', 'T', 'R', 'A', 'I', 'N', 'E', 'N', 'D'};
constexpr size_t kPrefix = 24;

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

std::string build_header(const nlohmann::json& meta, const std::vector<NamedTensor>& tensors,
                         std::vector<size_t>& offsets) {
  // Offsets depend on the header length, which depends on the offsets' digits:
  // iterate until the layout is stable (two rounds in practice).
  size_t header_guess = 0;
  for (int round = 0; round < 8; ++round) {
    nlohmann::json list = nlohmann::json::array();
    size_t at = align64(kPrefix + header_guess);
    offsets.clear();
    for (const NamedTensor& t : tensors) {
      offsets.push_back(at);
      list.push_back(
          {{"name", t.name},
           {"dtype", std::string(dtype_name(t.tensor.dtype()))},
           {"shape", std::vector<int64_t>(t.tensor.shape().begin(), t.tensor.shape().end())},
           {"offset", at},
           {"bytes", t.tensor.nbytes()},
           {"crc32c", crc32c(t.tensor.raw(), t.tensor.nbytes())}});
      at = align64(at + t.tensor.nbytes());
    }
    const std::string text = nlohmann::json{{"meta", meta}, {"tensors", list}}.dump(1);
    if (text.size() == header_guess) return text;
    header_guess = text.size();
  }
  DTRAIN_CHECK(false, "checkpoint header layout did not converge");
}

}  // namespace

void write_checkpoint(const fs::path& file, const nlohmann::json& meta,
                      const std::vector<NamedTensor>& tensors) {
  for (const NamedTensor& t : tensors) {
    DTRAIN_CHECK(t.tensor.device().is_cpu(), "checkpoint tensor {} is on {}", t.name,
                 t.tensor.device().str());
  }
  std::vector<size_t> offsets;
  const std::string header = build_header(meta, tensors, offsets);
  const uint32_t fixed[4] = {kCheckpointVersion, static_cast<uint32_t>(header.size()),
                             crc32c(header.data(), header.size()), 0};
  static constexpr char kZeros[64] = {};
  const auto bytes = [](const void* p, size_t n) {
    return std::string_view(static_cast<const char*>(p), n);
  };
  std::vector<std::string_view> parts = {bytes(kMagic, 8), bytes(fixed, sizeof(fixed)), header};
  size_t at = kPrefix + header.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    parts.push_back(bytes(kZeros, offsets[i] - at));
    parts.push_back(bytes(tensors[i].tensor.raw(), tensors[i].tensor.nbytes()));
    at = offsets[i] + tensors[i].tensor.nbytes();
  }
  parts.push_back(bytes(kTrailer, sizeof(kTrailer)));
  write_file_atomic(file.string(), parts);
}

namespace {

[[noreturn]] void bad(const fs::path& file, size_t offset, const std::string& what) {
  throw Error(fmt::format("{}: offset {}: {}", file.string(), offset, what),
              "this file is not a complete dtrain checkpoint: use another (the earlier ones "
              "are kept beside it), or train without --resume");
}

struct Raw {
  std::string bytes;
  const char* at(size_t off) const { return bytes.data() + off; }
};

nlohmann::json parse_header(const fs::path& file, const Raw& raw) {
  const size_t size = raw.bytes.size();
  if (size < kPrefix + sizeof(kTrailer) || std::memcmp(raw.at(0), kMagic, 8) != 0) {
    bad(file, 0, "not a dtrain checkpoint (bad magic or too short)");
  }
  uint32_t fixed[4];
  std::memcpy(fixed, raw.at(8), sizeof(fixed));
  if (fixed[3] != 0) bad(file, 20, "reserved header field is not zero");
  if (fixed[0] != kCheckpointVersion) {
    bad(file, 8,
        fmt::format("format version {}, this dtrain reads version {}", fixed[0],
                    kCheckpointVersion));
  }
  if (std::memcmp(raw.at(size - sizeof(kTrailer)), kTrailer, sizeof(kTrailer)) != 0) {
    bad(file, size, "the end marker is missing: the file is truncated");
  }
  if (kPrefix + fixed[1] > size - sizeof(kTrailer)) bad(file, 12, "header longer than the file");
  if (crc32c(raw.at(kPrefix), fixed[1]) != fixed[2]) bad(file, kPrefix, "header checksum mismatch");
  try {
    return nlohmann::json::parse(raw.at(kPrefix), raw.at(kPrefix) + fixed[1]);
  } catch (const nlohmann::json::exception& e) {
    bad(file, kPrefix, std::string("unreadable header: ") + e.what());
  }
}

using BlobEntry = CheckpointReader::Blob;

// One header entry, checked against a file of `file_size` bytes.
BlobEntry parse_entry(const fs::path& file, const nlohmann::json& e, size_t file_size) {
  try {
    BlobEntry b;
    b.name = e.at("name").get<std::string>();
    b.dtype = parse_dtype(e.at("dtype").get<std::string>());
    const auto dims = e.at("shape").get<std::vector<int64_t>>();
    b.offset = e.at("offset").get<size_t>();
    b.bytes = e.at("bytes").get<size_t>();
    b.crc = e.at("crc32c").get<uint32_t>();
    for (int64_t d : dims) {
      if (d < 0 || dims.size() > Shape::kMaxDims) bad(file, b.offset, b.name + ": bad shape");
      b.shape.push_back(d);
    }
    if (static_cast<size_t>(b.shape.numel()) * dtype_size(b.dtype) != b.bytes ||
        b.offset + b.bytes > file_size - sizeof(kTrailer) || b.offset < kPrefix) {
      bad(file, b.offset,
          fmt::format("tensor \"{}\": {} bytes at this offset do not fit the file", b.name,
                      b.bytes));
    }
    return b;
  } catch (const nlohmann::json::exception& ex) {
    bad(file, kPrefix, std::string("malformed tensor entry: ") + ex.what());
  } catch (const Error& ex) {
    if (ex.message().find(file.string()) == 0) throw;
    bad(file, kPrefix, ex.message());
  }
}

[[noreturn]] void bad_checksum(const fs::path& file, const BlobEntry& b) {
  bad(file, b.offset,
      fmt::format("tensor \"{}\": checksum mismatch (the data is corrupted)", b.name));
}

}  // namespace

CheckpointReader::CheckpointReader(const fs::path& file, bool verify)
    : file_(file), in_(file, std::ios::binary | std::ios::ate) {
  if (!in_) {
    throw Error(fmt::format("{}: cannot open checkpoint: {}", file.string(), std::strerror(errno)),
                "check the path given to --resume");
  }
  size_ = static_cast<size_t>(in_.tellg());
  // The prefix, the header and the end marker, laid out as parse_header expects them.
  Raw head;
  if (size_ < kPrefix + sizeof(kTrailer)) bad(file, 0, "not a dtrain checkpoint (too short)");
  head.bytes.resize(kPrefix);
  read_at(0, kPrefix, head.bytes.data());
  if (std::memcmp(head.at(0), kMagic, 8) != 0) bad(file, 0, "not a dtrain checkpoint (bad magic)");
  uint32_t header_bytes = 0;
  std::memcpy(&header_bytes, head.at(12), 4);
  if (kPrefix + size_t{header_bytes} > size_ - sizeof(kTrailer))
    bad(file, 12, "header longer than the file");
  head.bytes.resize(kPrefix + header_bytes + sizeof(kTrailer));
  read_at(kPrefix, header_bytes, head.bytes.data() + kPrefix);
  read_at(size_ - sizeof(kTrailer), sizeof(kTrailer), head.bytes.data() + kPrefix + header_bytes);
  const nlohmann::json header = parse_header(file, head);
  if (!header.contains("meta") || !header.contains("tensors") || !header["tensors"].is_array()) {
    bad(file, kPrefix, "header lacks \"meta\" or \"tensors\"");
  }
  meta_ = header["meta"];
  for (const nlohmann::json& e : header["tensors"]) blobs_.push_back(parse_entry(file, e, size_));
  data_start_ = kPrefix + header_bytes;
  if (verify) scan(/*checksums=*/true);
}

void CheckpointReader::check_padding() const { scan(/*checksums=*/false); }

// One pass in file order: zeros in the padding between blobs (and no overlap), and with
// `checksums` every blob's CRC-32C, so that no byte of the file escapes a check.
void CheckpointReader::scan(bool checksums) const {
  const fs::path& file = file_;
  std::vector<const BlobEntry*> order;
  for (const BlobEntry& b : blobs_) order.push_back(&b);
  std::sort(order.begin(), order.end(),
            [](const BlobEntry* x, const BlobEntry* y) { return x->offset < y->offset; });
  std::vector<char> buf(size_t{1} << 20);
  size_t at = data_start_;
  auto padding_to = [&](size_t end) {
    while (at < end) {
      const size_t n = std::min(buf.size(), end - at);
      read_at(at, n, buf.data());
      const auto* p = std::find_if(buf.data(), buf.data() + n, [](char c) { return c != 0; });
      if (p != buf.data() + n)
        bad(file, at + static_cast<size_t>(p - buf.data()),
            "non-zero padding (the file is corrupted)");
      at += n;
    }
  };
  for (const BlobEntry* b : order) {
    if (b->offset < at) bad(file, b->offset, "overlapping blobs");
    padding_to(b->offset);
    at = b->offset + b->bytes;
    if (!checksums) continue;
    uint32_t crc = 0;
    for (size_t done = 0; done < b->bytes;) {
      const size_t n = std::min(buf.size(), b->bytes - done);
      read_at(b->offset + done, n, buf.data());
      crc = crc32c(buf.data(), n, crc);
      done += n;
    }
    if (crc != b->crc) bad_checksum(file, *b);
  }
  padding_to(size_ - sizeof(kTrailer));
}

void CheckpointReader::read_at(size_t offset, size_t bytes, char* out) const {
  in_.seekg(static_cast<std::streamoff>(offset));
  in_.read(out, static_cast<std::streamsize>(bytes));
  if (!in_) bad(file_, offset, "short read");
}

bool CheckpointReader::has(std::string_view name) const {
  return std::any_of(blobs_.begin(), blobs_.end(),
                     [&](const BlobEntry& b) { return b.name == name; });
}

const CheckpointReader::Blob& CheckpointReader::blob(std::string_view name) const {
  for (const BlobEntry& b : blobs_)
    if (b.name == name) return b;
  throw Error(fmt::format("{}: checkpoint has no tensor \"{}\"", file_.string(), name),
              "was it written for a different model? check model.arch and its options");
}

Tensor CheckpointReader::read(std::string_view name) const { return read_blob(blob(name)); }

Tensor CheckpointReader::read_blob(const Blob& b) const {
  Tensor t = Tensor::empty(b.shape, b.dtype);
  read_at(b.offset, b.bytes, static_cast<char*>(t.raw()));
  if (crc32c(t.raw(), b.bytes) != b.crc) bad_checksum(file_, b);
  return t;
}

void CheckpointReader::pieces(std::string_view name, int64_t piece_elems,
                              const std::function<void(int64_t, const Tensor&)>& fn) const {
  const BlobEntry& b = blob(name);
  const int64_t total = b.shape.numel();
  const size_t width = dtype_size(b.dtype);
  const Tensor buf =
      Tensor::empty(Shape{std::max<int64_t>(1, std::min(piece_elems, total))}, b.dtype);
  uint32_t crc = 0;
  for (int64_t lo = 0; lo < total; lo += buf.numel()) {
    const int64_t n = std::min(buf.numel(), total - lo);
    const size_t bytes = static_cast<size_t>(n) * width;
    read_at(b.offset + static_cast<size_t>(lo) * width, bytes, static_cast<char*>(buf.raw()));
    crc = crc32c(buf.raw(), bytes, crc);
    fn(lo, buf.view(0, Shape{n}));
  }
  if (crc != b.crc) {
    bad(file_, b.offset,
        fmt::format("tensor \"{}\": checksum mismatch while loading it (the file changed "
                    "after it was verified, or the disk returned other bytes)",
                    b.name));
  }
}

Checkpoint CheckpointReader::header() const {
  Checkpoint ck;
  ck.file = file_;
  ck.meta = meta_;
  return ck;
}

Checkpoint CheckpointReader::read_wanted(
    const std::function<bool(const std::string&)>& want) const {
  Checkpoint ck = header();
  for (const BlobEntry& b : blobs_)
    if (want(b.name)) ck.tensors.push_back({b.name, read_blob(b)});
  return ck;
}

Checkpoint read_checkpoint(const fs::path& file) {
  const CheckpointReader r(file, /*verify=*/false);
  r.check_padding();  // read_blob checks each blob's checksum: the file is read once
  return r.read_wanted([](const std::string&) { return true; });
}

Checkpoint read_checkpoint_blobs(const fs::path& file,
                                 const std::function<bool(const std::string&)>& want) {
  return CheckpointReader(file, /*verify=*/false).read_wanted(want);
}

const Tensor& Checkpoint::get(std::string_view name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return t.tensor;
  }
  throw Error(fmt::format("{}: checkpoint has no tensor \"{}\"", file.string(), name),
              "was it written for a different model? check model.arch and its options");
}

fs::path checkpoint_path(const fs::path& dir, int64_t step) {
  return dir / fmt::format("step-{:08d}.dtckpt", step);
}

fs::path sharded_checkpoint_path(const fs::path& dir, int64_t step) {
  return dir / fmt::format("step-{:08d}", step);
}

bool is_sharded_checkpoint(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(path / "manifest.dtckpt", ec);
}

std::optional<int64_t> step_of_name(const fs::path& path) {
  static const std::regex kName(R"(step-(\d+)(\.dtckpt)?)");
  std::smatch m;
  const std::string name = path.filename().string();
  if (!std::regex_match(name, m, kName)) return std::nullopt;
  const std::string digits = m[1];
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;  // too long
  return step;
}

std::vector<fs::path> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::optional<int64_t> step = step_of_name(entry.path());
    const bool file = entry.path().extension() == ".dtckpt";
    if (step && (file || is_sharded_checkpoint(entry.path())))
      found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, p] : found) out.push_back(p);
  return out;
}

// A `<checkpoint>.tmp<pid>` (or best.json's) whose writer is this process or no longer
// runs here: a temporary of another live writer (a second job on the same directory) is
// its own.
bool abandoned_temporary(const fs::path& file) {
  const std::string name = file.filename().string();
  const std::string best = std::string(kBestRecordName) + ".tmp";
  size_t at = name.find(".dtckpt.tmp"), skip = std::strlen(".dtckpt.tmp");
  if (name.starts_with(best)) at = 0, skip = best.size();
  if (at == std::string::npos) return false;
  const std::string digits = name.substr(at + skip);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const long pid = std::strtol(digits.c_str(), nullptr, 10);
  if (pid == static_cast<long>(::getpid())) return true;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

std::optional<int64_t> best_record_step(const fs::path& dir) {
  const fs::path file = dir / kBestRecordName;
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  std::ifstream in(file);
  std::string why = "not a best-checkpoint record (a JSON object with a step)";
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    const nlohmann::json& step = j.at("step");
    if (step.is_number_integer() && step.get<int64_t>() >= 0) {
      // The checkpoint it names, when it names one, must be that step's.
      const auto named = j.find("checkpoint");
      if (named == j.end() || named->is_null()) return step.get<int64_t>();
      if (named->is_string() &&
          step_of_name(named->get<std::string>()) == std::optional(step.get<int64_t>()))
        return step.get<int64_t>();
      why = fmt::format("names step {} and checkpoint {}, which disagree", step.dump(),
                        named->dump());
    }
  } catch (const nlohmann::json::exception&) {
  }
  throw Error(fmt::format("{}: {}", file.string(), why),
              "it is written by dtrain train with train.best.metric; remove it, and a "
              "resumed run writes it again");
}

void prune_checkpoints(const fs::path& dir, int keep, const std::vector<int64_t>& also_keep) {
  std::vector<fs::path> all = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max(keep, 1)) < all.size(); ++i) {
    const int64_t step = step_of_name(all[i]).value_or(-1);
    if (std::find(also_keep.begin(), also_keep.end(), step) == also_keep.end())
      fs::remove_all(all[i]);
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (abandoned_temporary(entry.path())) fs::remove(entry.path(), ec);
  }
}

}  // namespace dtrain::runtime
