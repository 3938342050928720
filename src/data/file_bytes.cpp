// Plain files are read with one fread of their stat size; gzip files stream
// through zlib's gzread in 1 MiB steps. gzread also accepts concatenated gzip
// members, which is what the format allows.
#include "data/file_bytes.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace dtrain {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_or_throw(const std::string& path, const std::string& missing_hint) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(fmt::format("{}: is a directory, expected a dataset file", path),
                "point data.path at the directory that holds the files");
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    if (err == ENOENT) throw Error(fmt::format("{}: file not found", path), missing_hint);
    throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(err)),
                "check the file's permissions");
  }
  return f;
}

std::vector<uint8_t> read_plain(std::FILE* f, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))  // a device, a pipe, a socket
    throw Error(fmt::format("{}: not a regular file", path), "pass a file on disk");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(fmt::format("{}: cannot stat: {}", path, ec.message()));
  std::vector<uint8_t> bytes(size);
  if (size > 0 && std::fread(bytes.data(), 1, size, f) != size)
    throw Error(fmt::format("{}: read error after {} bytes", path, std::ftell(f)),
                "the file changed while it was read, or the disk failed; read it again");
  return bytes;
}

[[noreturn]] void corrupt_gzip(const std::string& path, gzFile g, const char* why) {
  const long at = gzoffset(g);
  throw Error(fmt::format("{}: corrupt gzip stream near compressed byte {}: {}", path, at, why),
              "the download is damaged; fetch the file again (or gunzip it to see how far it "
              "decompresses)");
}

std::vector<uint8_t> read_gzip(const std::string& path) {
  gzFile g = gzopen(path.c_str(), "rb");
  if (g == nullptr) throw Error(fmt::format("{}: cannot open as gzip", path));
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(g, gzclose);
  constexpr unsigned kChunk = 1u << 20;
  std::vector<uint8_t> bytes;
  for (;;) {
    const size_t have = bytes.size();
    bytes.resize(have + kChunk);
    const int n = gzread(g, bytes.data() + have, kChunk);
    int err = Z_OK;
    const char* msg = gzerror(g, &err);
    if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) corrupt_gzip(path, g, msg);
    bytes.resize(have + static_cast<size_t>(n));
    if (n == 0) break;
  }
  bytes.shrink_to_fit();
  return bytes;
}

}  // namespace

std::string FileBytes::where(uint64_t offset) const {
  return fmt::format("{}: byte {}{}", path, offset,
                     compression == Compression::gzip ? " (of the decompressed data)" : "");
}

FileBytes read_file_bytes(const std::string& path, const std::string& missing_hint) {
  File f = open_or_throw(path, missing_hint);
  uint8_t magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f.get());
  FileBytes out;
  out.path = path;
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    f.reset();
    out.compression = Compression::gzip;
    out.bytes = read_gzip(path);
  } else {
    std::rewind(f.get());
    out.bytes = read_plain(f.get(), path);
  }
  return out;
}

std::string find_data_file(const std::string& dir, const std::string& name,
                           const std::string& missing_hint) {
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  std::error_code ec;
  for (const std::string& candidate : {base.string(), base.string() + ".gz"}) {
    if (std::filesystem::exists(candidate, ec)) return candidate;
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    throw Error(fmt::format("{}: dataset directory not found (looking for {})", dir, name),
                missing_hint);
  }
  throw Error(fmt::format("{}: neither {} nor {}.gz exists", dir, name, name), missing_hint);
}

void for_each_line(std::string_view text,
                   const std::function<void(std::string_view line, int64_t number)>& fn) {
  int64_t number = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a byte-order mark
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line, ++number);
  }
}

}  // namespace dtrain
