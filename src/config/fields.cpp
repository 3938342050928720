// Strict scalar readers: numbers are plain (unquoted) YAML numbers, booleans are
// exactly true/false, enums are one of their spellings; everything else is an
// Error that names the key, the position, what was expected and what was found.
#include "config/fields.h"

#include <charconv>
#include <cmath>

#include <fmt/ranges.h>
#include "config/suggest.h"

#include "core/error.h"

namespace dtrain::config {
namespace {

std::optional<double> as_number(std::string_view s) {
  if (s.starts_with('+')) s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (end != s.data() + s.size() || (ec != std::errc() && ec != std::errc::result_out_of_range))
    return std::nullopt;
  if (ec == std::errc::result_out_of_range) return std::nullopt;
  return v;
}

bool looks_literal(std::string_view s) {
  return as_number(s).has_value() || s == "true" || s == "false" || s == "null";
}

std::string shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 60)) {
    if (c == '"' || c == '\\') out += '\\';
    if (c < 0x20)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (s.size() > 60) out += "...";
  return out;
}

void expect_scalar(const ConfigNode& n, std::string_view path, const std::string& what) {
  if (n.kind != ConfigNode::Kind::scalar) {
    fail(n.loc, path, fmt::format("expected {}, got {}", what, describe(n)));
  }
}

void expect_plain(const ConfigNode& n, std::string_view path, const std::string& what) {
  expect_scalar(n, path, what);
  if (n.quoted) {
    fail(n.loc, path, fmt::format("expected {}, got {}", what, describe(n)),
         looks_literal(n.text) ? "remove the quotes: a quoted value is a string" : "");
  }
}

}  // namespace

void fail(const SourceLoc& loc, std::string_view path, std::string_view msg, std::string hint) {
  std::string where = loc.str();
  if (!path.empty()) where += (where.empty() ? "" : ": ") + std::string(path);
  throw Error(where.empty() ? std::string(msg) : fmt::format("{}: {}", where, msg),
              std::move(hint));
}

std::string describe(const ConfigNode& n) {
  switch (n.kind) {
    case ConfigNode::Kind::null:
      return "null";
    case ConfigNode::Kind::map:
      return "a mapping";
    case ConfigNode::Kind::list:
      return "a list";
    case ConfigNode::Kind::scalar:
      break;
  }
  if (n.quoted) {
    return looks_literal(n.text) ? fmt::format("\"{}\" (a quoted string)", shown(n.text))
                                 : fmt::format("\"{}\"", shown(n.text));
  }
  if (as_number(n.text)) return shown(n.text);
  return fmt::format("\"{}\"", shown(n.text));
}

std::string IntRange::phrase() const {
  const int64_t top = std::numeric_limits<int32_t>::max();
  if (hi >= top && lo == 1) return "a positive integer";
  if (hi >= top && lo == 0) return "a non-negative integer";
  if (hi >= top) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer in [{}, {}]", lo, hi);
}

std::string RealRange::phrase() const {
  if (std::isinf(hi) && lo == 0) return lo_open ? "a positive number" : "a non-negative number";
  if (std::isinf(hi)) return fmt::format("a number {} {}", lo_open ? ">" : ">=", format_real(lo));
  return fmt::format("a number in {}{}, {}{}", lo_open ? "(" : "[", format_real(lo),
                     format_real(hi), hi_open ? ")" : "]");
}

int64_t read_int(const ConfigNode& n, std::string_view path, const IntRange& range) {
  const std::string what = range.phrase();
  expect_plain(n, path, what);
  std::string_view s = n.text;
  if (s.starts_with('+')) s.remove_prefix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    // 1e6 and 2.0 are integers written as reals; 1.5 is not.
    auto d = as_number(n.text);
    if (!d || std::trunc(*d) != *d || std::fabs(*d) > 9.0e18) {
      fail(n.loc, path, fmt::format("expected {}, got {}", what, describe(n)),
           d && std::trunc(*d) != *d ? "this key counts whole things; use an integer" : "");
    }
    v = static_cast<int64_t>(*d);
  }
  if (v < range.lo || v > range.hi)
    fail(n.loc, path, fmt::format("expected {}, got {}", what, shown(n.text)));
  return v;
}

double read_real(const ConfigNode& n, std::string_view path, const RealRange& range) {
  const std::string what = range.phrase();
  expect_plain(n, path, what);
  auto d = as_number(n.text);
  if (!d || !std::isfinite(*d))
    fail(n.loc, path, fmt::format("expected {}, got {}", what, describe(n)));
  const double v = *d;
  const bool low = range.lo_open ? v <= range.lo : v < range.lo;
  const bool high = range.hi_open ? v >= range.hi : v > range.hi;
  if (low || high) fail(n.loc, path, fmt::format("expected {}, got {}", what, shown(n.text)));
  return v;
}

bool read_bool(const ConfigNode& n, std::string_view path) {
  expect_plain(n, path, "true or false");
  if (n.text == "true") return true;
  if (n.text == "false") return false;
  fail(n.loc, path, fmt::format("expected true or false, got {}", describe(n)),
       "booleans are spelled true or false (not yes/no, on/off, 1/0 or True)");
}

std::string read_string(const ConfigNode& n, std::string_view path) {
  expect_scalar(n, path, "a string");
  if (n.text.empty()) fail(n.loc, path, "expected a non-empty string, got \"\"");
  return n.text;
}

std::string read_word(const ConfigNode& n, std::string_view path,
                      const std::vector<std::string>& choices) {
  const std::string what = fmt::format("one of {}", fmt::join(choices, ", "));
  expect_scalar(n, path, what);
  for (const auto& c : choices)
    if (c == n.text) return c;
  fail(n.loc, path,
       fmt::format("expected {}, got {}{}", what, describe(n), did_you_mean(n.text, choices)));
}

std::string quote_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string format_real(double v) {
  std::string s = fmt::format("{}", v);
  // "1e-08" reads back as a number; "inf"/"nan" cannot occur (readers reject them).
  return s;
}

}  // namespace dtrain::config
