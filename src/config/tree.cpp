// Text -> ConfigNode: file reading with limits, byte checks (UTF-8, NUL, control
// characters), a nesting pre-scan that keeps deep input away from yaml-cpp's
// recursive parser, then yaml-cpp and a copy into ConfigNode that detects
// duplicate keys. No knowledge of the job schema here.
#include "config/tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace dtrain::config {
namespace {

constexpr size_t kMaxNodes = 100000;  // aliases can expand a small file into a huge tree

std::string at(std::string_view origin, int line, int col) {
  return SourceLoc{std::string(origin), line, col}.str();
}

// Length of the UTF-8 sequence starting at s[i], or 0 if it is malformed.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return 0;
  if (n == 2 && c < 0xC2) return 0;                   // overlong
  if (n == 3 && c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
  if (n == 3 && c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
  if (n == 4 && ((c == 0xF0 && b(1) < 0x90) || c > 0xF4 || (c == 0xF4 && b(1) >= 0x90))) return 0;
  return n;
}

}  // namespace

std::string SourceLoc::str() const {
  if (line <= 0) return origin;
  return fmt::format("{}:{}:{}", origin, line, col);
}

Entry* ConfigNode::find(std::string_view key) {
  for (auto& e : entries)
    if (e.key == key) return &e;
  return nullptr;
}

const Entry* ConfigNode::find(std::string_view key) const {
  return const_cast<ConfigNode*>(this)->find(key);
}

std::string_view kind_name(ConfigNode::Kind kind) {
  switch (kind) {
    case ConfigNode::Kind::null:
      return "null";
    case ConfigNode::Kind::scalar:
      return "a scalar";
    case ConfigNode::Kind::map:
      return "a mapping";
    case ConfigNode::Kind::list:
      return "a list";
  }
  return "?";
}

std::string read_job_file(const std::string& path, std::string_view kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  const bool job = kind == "job file";
  if (ec || !fs::exists(status)) {
    throw Error(fmt::format("{}: {} not found", path, kind),
                job ? "check the path; ready-made job files are in configs/" : "check the path");
  }
  if (fs::is_directory(status)) {
    throw Error(fmt::format("{}: is a directory, not a {}", path, kind),
                job ? "pass a YAML file, e.g. configs/example-resnet.yaml" : "pass a YAML file");
  }
  const auto size = fs::file_size(path, ec);
  if (!ec && size > kMaxFileBytes) {
    throw Error(fmt::format("{}: file is {} bytes, more than the {} allowed for a job file", path,
                            size, kMaxFileBytes),
                "a job file holds settings only; point data.path at large data instead");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(fmt::format("{}: cannot read the job file: {}", path, std::strerror(errno)),
                "check the file's permissions");
  }
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxFileBytes) {  // grew while we looked, or not a regular file
    throw Error(fmt::format("{}: more than {} bytes, too big for a job file", path, kMaxFileBytes));
  }
  return text;
}

void check_bytes(std::string_view text, std::string_view origin) {
  int line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0) {
      throw Error(fmt::format("{}: NUL byte in the job file", at(origin, line, col)),
                  "job files are UTF-8 text; is this a binary file?");
    }
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      throw Error(
          fmt::format("{}: control character 0x{:02x} in the job file", at(origin, line, col), c));
    }
    const size_t n = utf8_length(text, i);
    if (n == 0) {
      throw Error(fmt::format("{}: invalid UTF-8 (byte 0x{:02x})", at(origin, line, col), c),
                  "save the job file as UTF-8");
    }
    i += n;
    if (c == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
}

namespace {

// Tracks quotes, comments and flow brackets of one line, carrying quote and
// bracket state across lines (flow collections and quoted scalars may span lines).
struct NestingScan {
  std::string_view origin;
  char quote = 0;
  int flow = 0;
  std::vector<int> indents;  // block indentation levels open at flow depth 0
  int block_scalar_indent = -1;

  static bool token_start(std::string_view line, size_t i) {
    size_t k = i;
    while (k > 0 && line[k - 1] == ' ') --k;
    return k == 0 || std::strchr(":[{,-?", line[k - 1]) != nullptr;
  }

  // "key: |", "- >-", "key: |2": the following more-indented lines are text.
  static bool opens_block_scalar(std::string_view line) {
    size_t end = line.find_last_not_of(" \t");
    if (end == std::string_view::npos) return false;
    for (int k = 0; k < 2 && end > 0 && std::strchr("+-0123456789", line[end]) != nullptr; ++k)
      --end;
    return (line[end] == '|' || line[end] == '>') && end > 0 && line[end - 1] == ' ';
  }

  void fail(int line, int col) const {
    throw Error(fmt::format("{}: nesting deeper than {} levels", at(origin, line, col), kMaxDepth),
                "a job file needs at most 4 levels; look for runaway brackets or indentation");
  }

  // Returns the deepest flow level reached on the line.
  int scan_flow(std::string_view line, int line_no, size_t from, int block_depth) {
    int deepest = flow;
    for (size_t i = from; i < line.size(); ++i) {
      const char c = line[i];
      if (quote != 0) {
        if (quote == '"' && c == '\\')
          ++i;
        else if (c == quote)
          quote = 0;
        continue;
      }
      if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) break;
      if ((c == '"' || c == '\'') && token_start(line, i)) quote = c;
      if (c == '[' || c == '{') {
        ++flow;
        deepest = std::max(deepest, flow);
        if (block_depth + flow > kMaxDepth + 4) fail(line_no, static_cast<int>(i) + 1);
      }
      if ((c == ']' || c == '}') && flow > 0) --flow;
    }
    return deepest;
  }

  void scan_line(std::string_view line, int line_no) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t indent = line.find_first_not_of(' ');
    if (indent == std::string_view::npos || line[indent] == '#') return;
    if (block_scalar_indent >= 0 && quote == 0 && static_cast<int>(indent) > block_scalar_indent)
      return;  // content of a | or > scalar
    block_scalar_indent = -1;
    int depth = 0;
    if (quote == 0 && flow == 0) {
      while (!indents.empty() && indents.back() >= static_cast<int>(indent)) indents.pop_back();
      indents.push_back(static_cast<int>(indent));
      size_t i = indent;
      int dashes = 0;
      while (i + 1 < line.size() && line[i] == '-' && line[i + 1] == ' ') {
        ++dashes;
        i = line.find_first_not_of(' ', i + 1);
        if (i == std::string_view::npos) break;
      }
      depth = static_cast<int>(indents.size()) + dashes;
      if (depth > kMaxDepth + 4) fail(line_no, static_cast<int>(indent) + 1);
    }
    scan_flow(line, line_no, indent, depth);
    if (quote == 0 && flow == 0 && opens_block_scalar(line)) {
      block_scalar_indent = static_cast<int>(indent);
    }
  }
};

class Converter {
 public:
  Converter(std::string_view origin, bool positions) : origin_(origin), positions_(positions) {}

  ConfigNode convert(const YAML::Node& n, int depth, const std::string& path,
                     const SourceLoc& fallback) {
    // A null value (`key:` alone) has no text of its own: point at its key.
    SourceLoc loc = n.IsNull() ? fallback : locate(n.Mark(), fallback);
    if (depth > kMaxDepth) {
      throw Error(
          fmt::format("{}: {}nesting deeper than {} levels", loc.str(), prefix(path), kMaxDepth));
    }
    if (++count_ > kMaxNodes) {
      throw Error(fmt::format("{}: more than {} YAML nodes (are aliases expanding?)", loc.str(),
                              kMaxNodes));
    }
    const std::string& tag = n.Tag();
    if (!tag.empty() && tag != "?" && tag != "!") {
      throw Error(
          fmt::format("{}: {}YAML tag \"{}\" is not supported", loc.str(), prefix(path), tag),
          "write the plain value without a tag");
    }
    ConfigNode out;
    out.loc = loc;
    switch (n.Type()) {
      case YAML::NodeType::Scalar:
        out.kind = ConfigNode::Kind::scalar;
        out.text = n.Scalar();
        out.quoted = tag == "!";
        break;
      case YAML::NodeType::Sequence:
        convert_list(n, depth, path, out);
        break;
      case YAML::NodeType::Map:
        convert_map(n, depth, path, out);
        break;
      default:
        out.kind = ConfigNode::Kind::null;
        break;
    }
    return out;
  }

 private:
  static std::string prefix(const std::string& path) { return path.empty() ? "" : path + ": "; }

  SourceLoc locate(const YAML::Mark& m, const SourceLoc& fallback) const {
    if (!positions_ || m.line < 0) return fallback;
    return SourceLoc{std::string(origin_), m.line + 1, m.column + 1};
  }

  void convert_list(const YAML::Node& n, int depth, const std::string& path, ConfigNode& out) {
    out.kind = ConfigNode::Kind::list;
    size_t index = 0;
    for (const auto& item : n) {
      out.items.push_back(convert(item, depth + 1, fmt::format("{}[{}]", path, index++), out.loc));
    }
  }

  void convert_map(const YAML::Node& n, int depth, const std::string& path, ConfigNode& out) {
    out.kind = ConfigNode::Kind::map;
    std::unordered_map<std::string, size_t> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const SourceLoc key_loc = locate(it->first.Mark(), out.loc);
      if (!it->first.IsScalar()) {
        throw Error(fmt::format("{}: {}keys must be plain names, got {}", key_loc.str(),
                                prefix(path), it->first.IsNull() ? "null" : "a collection"));
      }
      const std::string key = it->first.Scalar();
      const std::string child = path.empty() ? key : path + "." + key;
      if (auto [pos, fresh] = seen.emplace(key, out.entries.size()); !fresh) {
        const SourceLoc& first = out.entries[pos->second].key_loc;
        const std::string where =  // a --set value has no lines to point at
            first.line > 0 ? fmt::format("first at line {}, column {}", first.line, first.col)
                           : std::string("given twice in one value");
        throw Error(
            fmt::format("{}: {}duplicate key \"{}\" ({})", key_loc.str(), prefix(path), key, where),
            "YAML keeps only one of them; delete or merge the other");
      }
      ConfigNode value = convert(it->second, depth + 1, child, key_loc);
      out.entries.push_back(Entry{key, key_loc, std::move(value)});
    }
  }

  std::string_view origin_;
  bool positions_;
  size_t count_ = 0;
};

// Counts documents with yaml-cpp's event parser, stopping at two. YAML::LoadAll is
// avoided: yaml-cpp 0.7 loops forever (allocating) on a stray top-level ',' because
// each round yields a null document without consuming the token
// (jbeder/yaml-cpp#1040, fixed upstream by #1319); here that shows up as a second
// document starting where the first did, and is reported as a syntax error.
struct EventSink : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

template <class Where>
size_t count_documents(std::string_view text, const Where& where) {
  std::istringstream in{std::string(text)};
  YAML::Parser parser(in);
  EventSink sink;
  while (sink.starts.size() < 2 && parser.HandleNextDocument(sink)) {
  }
  if (sink.starts.size() == 2) {
    const YAML::Mark& m = sink.starts[1];
    if (m.pos == sink.starts[0].pos) {
      const char c = m.pos >= 0 && static_cast<size_t>(m.pos) < text.size()
                         ? text[static_cast<size_t>(m.pos)]
                         : '?';
      throw Error(fmt::format("{}: YAML syntax error: unexpected '{}'", where(m), c),
                  "a ',' belongs inside [...] or {...}");
    }
    throw Error(fmt::format("{}: expected one YAML document, found a second", where(m)),
                "remove the extra '---' separators");
  }
  return sink.starts.size();
}

}  // namespace

void check_nesting(std::string_view text, std::string_view origin) {
  NestingScan scan;
  scan.origin = origin;
  int line_no = 1;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    scan.scan_line(text.substr(start, end - start), line_no++);
    start = end + 1;
  }
}

ConfigNode parse_yaml(std::string_view text, std::string_view origin, bool positions) {
  check_bytes(text, origin);
  check_nesting(text, origin);
  const auto where = [&](const YAML::Mark& m) {
    return positions && m.line >= 0 ? at(origin, m.line + 1, m.column + 1) : std::string(origin);
  };
  const SourceLoc top{std::string(origin), positions ? 1 : 0, positions ? 1 : 0};
  YAML::Node doc;
  try {
    if (count_documents(text, where) == 0)
      return ConfigNode{ConfigNode::Kind::null, {}, false, top, {}, {}};
    doc = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    // YAML indents with spaces only; yaml-cpp reports a tab as a structural error.
    const size_t tab = text.starts_with('\t') ? 0 : text.find("\n\t");
    if (tab != std::string_view::npos) {
      const auto line =
          std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(tab), '\n') +
          (tab == 0 ? 1 : 2);  // "\n\t" at `tab`: the tab begins the next line
      throw Error(fmt::format("{}: YAML syntax error: {} (line {} is indented with a tab)",
                              where(e.mark), e.msg, line),
                  "YAML indents with spaces only: replace the tab with spaces");
    }
    const bool alias =
        e.msg.find("alias") != std::string::npos || e.msg.find("anchor") != std::string::npos;
    throw Error(fmt::format("{}: YAML syntax error: {}", where(e.mark), e.msg),
                alias ? "an unquoted * starts a YAML alias: quote a value that begins with * "
                        "(freeze: [\"*.bias\"])"
                      : "check the indentation, colons and brackets around that position");
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("{}: cannot read the YAML: {}", where(e.mark), e.msg));
  }
  return Converter(origin, positions).convert(doc, 1, "", top);
}

}  // namespace dtrain::config
