// The schema's building blocks: a Field is one key (a leaf that reads and prints one
// value of the Job, or a section of further fields), plus the strict scalar readers
// that produce the "path: expected X, got Y" messages. The table itself is schema.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config/tree.h"
#include "runtime/job.h"

namespace dtrain::config {

struct Field {
  std::string key;
  std::vector<Field> children;  // non-empty for a section
  std::function<void(const ConfigNode&, const std::string& path, Job&)> parse;
  std::function<std::string(const Job&)> dump;  // the value as inline YAML
  bool required = false;
  bool is_section() const { return !children.empty(); }
};

const Field& job_schema();  // the root section

[[noreturn]] void fail(const SourceLoc& loc, std::string_view path, std::string_view msg,
                       std::string hint = {});
std::string describe(const ConfigNode& n);  // what "got ..." shows

struct IntRange {
  int64_t lo = 1;
  int64_t hi = std::numeric_limits<int64_t>::max();
  std::string phrase() const;  // "a positive integer", "an integer in [0, 3]"
};
struct RealRange {
  double lo = 0;
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = true;
  bool hi_open = true;
  std::string phrase() const;  // "a positive number", "a number in [0, 1)"
};

int64_t read_int(const ConfigNode& n, std::string_view path, const IntRange& range);
double read_real(const ConfigNode& n, std::string_view path, const RealRange& range);
bool read_bool(const ConfigNode& n, std::string_view path);
std::string read_string(const ConfigNode& n, std::string_view path);
std::string read_word(const ConfigNode& n, std::string_view path,
                      const std::vector<std::string>& choices);
std::string quote_string(std::string_view s);  // a double-quoted YAML scalar
std::string format_real(double v);             // shortest text that reads back exactly

template <class T>
struct OptionalTraits {
  static constexpr bool value = false;
  using type = T;
};
template <class T>
struct OptionalTraits<std::optional<T>> {
  static constexpr bool value = true;
  using type = T;
};

// A leaf whose value is acc(job); std::optional members accept null and print null.
template <class Acc, class Read, class Print>
Field leaf(std::string key, Acc acc, Read read, Print print) {
  using T = std::remove_cvref_t<decltype(acc(std::declval<Job&>()))>;
  using Traits = OptionalTraits<T>;
  Field f;
  f.key = std::move(key);
  f.parse = [acc, read](const ConfigNode& n, const std::string& path, Job& job) {
    auto& dst = acc(job);
    if constexpr (Traits::value) {
      if (n.kind == ConfigNode::Kind::null) return dst.reset();
    }
    dst = static_cast<typename Traits::type>(read(n, path));
  };
  f.dump = [acc, print](const Job& job) -> std::string {
    const auto& v = acc(const_cast<Job&>(job));  // read only
    if constexpr (Traits::value) {
      return v ? print(*v) : std::string("null");
    } else {
      return print(v);
    }
  };
  return f;
}

template <class Acc>
Field integer(std::string key, Acc acc, IntRange range = {}) {
  using T = typename OptionalTraits<std::remove_cvref_t<decltype(acc(std::declval<Job&>()))>>::type;
  range.hi = std::min<int64_t>(range.hi, std::numeric_limits<T>::max());
  return leaf(
      std::move(key), acc,
      [range](const ConfigNode& n, const std::string& p) { return read_int(n, p, range); },
      [](int64_t v) { return std::to_string(v); });
}

// An integer, or `auto` (stored as 0) for a value resolve.cpp derives.
template <class Acc>
Field integer_or_auto(std::string key, Acc acc, IntRange range = {}) {
  return leaf(
      std::move(key), acc,
      [range](const ConfigNode& n, const std::string& p) -> int64_t {
        if (n.kind == ConfigNode::Kind::scalar && n.text == "auto") return 0;
        return read_int(n, p, range);
      },
      [](int64_t v) { return v == 0 ? std::string("auto") : std::to_string(v); });
}

template <class Acc>
Field real(std::string key, Acc acc, RealRange range = {}) {
  return leaf(
      std::move(key), acc,
      [range](const ConfigNode& n, const std::string& p) { return read_real(n, p, range); },
      format_real);
}

template <class Acc>
Field boolean(std::string key, Acc acc) {
  return leaf(std::move(key), acc, read_bool,
              [](bool v) { return std::string(v ? "true" : "false"); });
}

template <class Acc>
Field text(std::string key, Acc acc) {
  return leaf(std::move(key), acc, read_string,
              [](const std::string& s) { return quote_string(s); });
}

template <class Acc>
Field enumeration(std::string key, Acc acc) {
  using E = std::remove_cvref_t<decltype(acc(std::declval<Job&>()))>;
  std::vector<std::string> choices;
  for (const auto& [e, name] : enum_names(E{})) choices.emplace_back(name);
  auto read = [choices](const ConfigNode& n, const std::string& p) {
    E e{};
    from_string(read_word(n, p, choices), e);
    return e;
  };
  return leaf(std::move(key), acc, read, [](E e) { return std::string(to_string(e)); });
}

inline Field section(std::string key, std::vector<Field> children) {
  Field f;
  f.key = std::move(key);
  f.children = std::move(children);
  return f;
}

inline Field required(Field f) {
  f.required = true;
  return f;
}

}  // namespace dtrain::config
