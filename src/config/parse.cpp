// Walks a ConfigNode against the schema: unknown keys (with did-you-mean), wrong
// node kinds for sections, required keys; leaves read themselves (fields.cpp).
// Records where every key was written so later checks can point at it.
#include "config/parse.h"

#include "config/fields.h"

#include <fmt/ranges.h>

#include "config/suggest.h"
#include "core/error.h"

namespace dtrain::config {
namespace {

std::string join_path(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
}

void collect_paths(const Field& f, const std::string& path, std::vector<std::string>& out) {
  for (const auto& c : f.children) {
    const std::string p = join_path(path, c.key);
    out.push_back(p);
    collect_paths(c, p, out);
  }
}

// A key that exists elsewhere ("lr" under train:) or is a typo of a sibling.
std::string suggestion(const Field& section, const std::string& path, const std::string& key) {
  std::vector<std::string> siblings;
  for (const auto& c : section.children) siblings.push_back(c.key);
  if (auto best = closest(key, siblings))
    return fmt::format(" (did you mean \"{}\"?)", join_path(path, *best));
  std::vector<std::string> all;
  collect_paths(job_schema(), "", all);
  for (const auto& p : all) {
    if (p.ends_with("." + key) || p == key) return fmt::format(" (did you mean \"{}\"?)", p);
  }
  std::vector<std::string> leaves;
  for (const auto& p : all) leaves.push_back(p.substr(p.rfind('.') + 1));
  if (auto best = closest(key, leaves)) {
    for (const auto& p : all)
      if (p.ends_with("." + *best)) return fmt::format(" (did you mean \"{}\"?)", p);
  }
  return {};
}

[[noreturn]] void unknown_key(const Field& section, const std::string& path, const Entry& e) {
  std::vector<std::string> keys;
  for (const auto& c : section.children) keys.push_back(c.key);
  throw Error(
      fmt::format("{}: unknown key \"{}\"{}", e.key_loc.str(), join_path(path, e.key),
                  suggestion(section, path, e.key)),
      fmt::format("{} takes: {}", path.empty() ? "the top level" : path, fmt::join(keys, ", ")));
}

void parse_section(const Field& section, const ConfigNode& node, const std::string& path, Job& job,
                   SourceMap& where) {
  if (node.kind != ConfigNode::Kind::map) {
    std::vector<std::string> keys;
    for (const auto& c : section.children) keys.push_back(c.key + ":");
    fail(node.loc, path.empty() ? "the job" : path,
         fmt::format("expected a mapping, got {}", describe(node)),
         fmt::format(
             "{} is a section with keys like {}", path.empty() ? "the file" : path,
             fmt::join(keys.begin(), keys.begin() + std::min<size_t>(3, keys.size()), ", ")));
  }
  for (const auto& e : node.entries) {
    const Field* field = nullptr;
    for (const auto& c : section.children)
      if (c.key == e.key) field = &c;
    if (field == nullptr) unknown_key(section, path, e);
    const std::string child = join_path(path, e.key);
    where[child] = field->is_section() ? e.key_loc : e.value.loc;
    if (field->is_section()) {
      parse_section(*field, e.value, child, job, where);
    } else {
      field->parse(e.value, child, job);
    }
  }
}

void check_required(const Field& section, const std::string& path, const SourceMap& where) {
  for (const auto& c : section.children) {
    const std::string child = join_path(path, c.key);
    if (c.is_section()) check_required(c, child, where);
    if (!c.required || where.contains(child)) continue;
    const auto parent = where.find(path);
    const SourceLoc loc = parent != where.end() ? parent->second : where.at("");
    fail(loc, child, "required key is missing",
         fmt::format("add it under {}:", path.empty() ? "the top level" : path));
  }
}

}  // namespace

void parse_job(const ConfigNode& root, Job& job, SourceMap& where) {
  parse_section(job_schema(), root, "", job, where);
  check_required(job_schema(), "", where);
}

}  // namespace dtrain::config
