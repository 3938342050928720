// A YAML document as plain data: maps keep every key in file order (so duplicates
// can be reported), and every node carries where it was written. Built from text by
// yaml-cpp after the byte-level checks; the typed layer never sees yaml-cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace dtrain::config {

struct Entry;

struct ConfigNode {
  enum class Kind { null, scalar, map, list };
  Kind kind = Kind::null;
  std::string text;     // scalar text
  bool quoted = false;  // quoted or block scalar: always a string, never a number
  SourceLoc loc;
  std::vector<Entry> entries;     // map
  std::vector<ConfigNode> items;  // list

  Entry* find(std::string_view key);
  const Entry* find(std::string_view key) const;
};

struct Entry {
  std::string key;
  SourceLoc key_loc;
  ConfigNode value;
};

// Reads a job file (or, by `kind`, another YAML input such as a cluster file): refuses
// missing / unreadable / oversized files with a hint.
std::string read_job_file(const std::string& path, std::string_view kind = "job file");

// Parses one YAML document. `origin` names the source in messages; with
// positions == false every node is located at the origin alone (for --set values).
// Throws Error for bad bytes, too-deep nesting, syntax errors and duplicate keys.
ConfigNode parse_yaml(std::string_view text, std::string_view origin, bool positions = true);

// Byte-level checks run before yaml-cpp sees the text (exposed for tests).
void check_bytes(std::string_view text, std::string_view origin);
void check_nesting(std::string_view text, std::string_view origin);

std::string_view kind_name(ConfigNode::Kind kind);  // "a mapping", "a list", ...

}  // namespace dtrain::config
