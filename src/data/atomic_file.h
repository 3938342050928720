// Atomic whole-file writes for every file dtrain writes (checkpoints, token shards,
// metrics, reports, traces): the bytes go to a temporary file beside the target, are
// fsync'ed, renamed over the target, and the directory is fsync'ed, so a reader sees
// the old file or the complete new one, never a torn one. Errors are dtrain::Error
// naming the file.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

// Writes the concatenation of `parts` to `path` (creating its directory).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts);
// fsync of a directory (after a rename in it), or an Error naming it.
void sync_directory(const std::string& dir);

}  // namespace dtrain
