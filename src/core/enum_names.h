// Spelling tables for enum classes: each options header declares one
// constexpr table of (value, name) pairs; these two lookups serve them all.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

namespace dtrain {

template <typename E, size_t N>
constexpr std::string_view enum_name(const std::pair<E, std::string_view> (&table)[N], E v) {
  for (const auto& [e, s] : table) {
    if (e == v) return s;
  }
  return "?";
}

template <typename E, size_t N>
constexpr bool enum_parse(const std::pair<E, std::string_view> (&table)[N], std::string_view text,
                          E& out) {
  for (const auto& [e, s] : table) {
    if (s == text) {
      out = e;
      return true;
    }
  }
  return false;
}

}  // namespace dtrain
