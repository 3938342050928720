// POSIX write + fsync + rename + fsync of the directory. The temporary file is
// `<path>.tmp<pid>` and is removed again when anything fails.
#include "data/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void io_error(const std::string& file, const std::string& what) {
  throw Error(fmt::format("{}: {}: {}", file, what, std::strerror(errno)),
              "check the disk space and the permissions of its directory");
}

void write_all(int fd, const std::string& file, std::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) io_error(file, "write failed");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void sync_directory(const std::string& dir) {
  const std::string name = dir.empty() ? "." : dir;
  const int fd = ::open(name.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) io_error(name, "cannot open the directory to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_error(name, "fsync of the directory failed");
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts) {
  const fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  if (ec)
    throw Error(fmt::format("{}: cannot create the directory: {}", dir.string(), ec.message()),
                "check the path and its permissions");
  const std::string tmp = fmt::format("{}.tmp{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_error(tmp, "cannot create");
  try {
    for (std::string_view part : parts) write_all(fd, tmp, part);
    if (::fsync(fd) != 0) io_error(tmp, "fsync failed");
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    io_error(tmp, "close failed");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    io_error(path, "rename into place failed");
  }
  sync_directory(dir.string());
}

}  // namespace dtrain
