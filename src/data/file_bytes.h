// Whole-file reads for dataset files: plain or gzip, told apart by the gzip magic
// (1f 8b), never by the file name. Errors are dtrain::Error naming the file and,
// for a corrupt stream, the compressed byte offset. No parsing of the contents here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

enum class Compression : uint8_t { none, gzip };

struct FileBytes {
  std::string path;
  Compression compression = Compression::none;
  std::vector<uint8_t> bytes;  // decompressed contents
  // "byte 16 of /d/x.gz (decompressed)": where a parse error points.
  std::string where(uint64_t offset) const;
  std::string_view text() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
};

// fn(line, number) for each line of a text file's contents: split at '\n', a final '\r'
// dropped, numbered from 1; nothing for the empty piece after a final newline. A UTF-8
// byte-order mark before the first line is no part of it.
void for_each_line(std::string_view text,
                   const std::function<void(std::string_view line, int64_t number)>& fn);

// Reads `path` completely; `hint` is shown when the file does not exist.
FileBytes read_file_bytes(const std::string& path, const std::string& missing_hint);

// The first existing of `dir/name` and `dir/name.gz`; throws Error listing both.
std::string find_data_file(const std::string& dir, const std::string& name,
                           const std::string& missing_hint);

}  // namespace dtrain
