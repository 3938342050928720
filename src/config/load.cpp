// Loading a job: read the file (limits first), parse YAML, apply --set overrides to
// the document, read it against the schema, fill derived defaults, validate.
// Each step throws dtrain::Error naming the file position or the --set.
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "config/parse.h"
#include "core/error.h"

namespace dtrain::config {
namespace {

void check_root(const ConfigNode& root, std::string_view filename) {
  if (root.kind == ConfigNode::Kind::null) {
    throw Error(
        fmt::format("{}: the job file is empty (nothing but blank lines or comments)", filename),
        "a job needs at least model: {arch: ...} and train: {steps: ...}; "
        "see configs/example-resnet.yaml");
  }
  if (root.kind != ConfigNode::Kind::map) {
    throw Error(fmt::format("{}: expected a mapping at the top level, got {}", root.loc.str(),
                            kind_name(root.kind)),
                "a job file is a set of sections: run:, model:, data:, optimizer:, train:, ...");
  }
}

ConfigNode* descend(ConfigNode& node, std::string_view key, const SourceLoc& loc,
                    std::string_view spec, std::string_view prefix) {
  if (node.kind != ConfigNode::Kind::map) {
    throw Error(fmt::format("--set {}: {} holds a value, not a section, so it has no key \"{}\"",
                            spec, prefix, key));
  }
  if (Entry* e = node.find(key)) {
    if (e->value.kind == ConfigNode::Kind::null)
      e->value.kind = ConfigNode::Kind::map;  // `key:` alone
    return &e->value;
  }
  node.entries.push_back(
      Entry{std::string(key), loc, ConfigNode{ConfigNode::Kind::map, {}, false, loc, {}, {}}});
  return &node.entries.back().value;
}

}  // namespace

void apply_override(ConfigNode& root, std::string_view spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string_view::npos) {
    throw Error(fmt::format("--set {}: expected key.path=value", spec),
                "e.g. --set optimizer.lr=0.01 or --set parallel={data: 2, tensor: 2}");
  }
  const std::string_view path = spec.substr(0, eq);
  std::vector<std::string_view> keys;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    keys.push_back(path.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (keys.back().empty() || keys.back().find_first_of(" \t") != std::string_view::npos) {
      throw Error(fmt::format("--set {}: \"{}\" is not a key path", spec, path),
                  "key paths are dot-separated names, e.g. optimizer.schedule.name");
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  const std::string origin = fmt::format("--set {}", spec);
  const SourceLoc loc{origin};
  ConfigNode value = parse_yaml(spec.substr(eq + 1), origin, false);
  ConfigNode* node = &root;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    const std::string prefix = fmt::format("{}", fmt::join(keys.begin(), keys.begin() + i, "."));
    node = descend(*node, keys[i], loc, spec, prefix);
  }
  if (node->kind != ConfigNode::Kind::map) {
    throw Error(fmt::format("--set {}: {} holds a value, not a section", spec,
                            fmt::join(keys.begin(), keys.end() - 1, ".")));
  }
  if (Entry* e = node->find(keys.back())) {
    e->key_loc = loc;
    e->value = std::move(value);
  } else {
    node->entries.push_back(Entry{std::string(keys.back()), loc, std::move(value)});
  }
}

Job load_job_text(std::string_view text, std::string_view filename,
                  const std::vector<std::string>& overrides, const ValidateContext& ctx,
                  SourceMap* where_out) {
  if (text.size() > kMaxFileBytes) {
    throw Error(fmt::format("{}: {} bytes, more than the {} allowed for a job file", filename,
                            text.size(), kMaxFileBytes));
  }
  ConfigNode root = parse_yaml(text, filename);
  check_root(root, filename);
  for (const auto& o : overrides) apply_override(root, o);
  Job job;
  SourceMap where;
  where[""] = SourceLoc{std::string(filename)};
  parse_job(root, job, where);
  ValidateContext own = ctx;
  if (ctx.model_only) {  // saturating: each degree may be as large as an int
    const ParallelOptions& p = job.parallel;
    int64_t world = 1;
    for (const int d : {p.tensor, p.pipeline, std::max(p.data, 1)})
      world = std::min<int64_t>(world * std::max(d, 1), INT32_MAX);
    own.world_size = static_cast<int>(world);
  }
  resolve_job(job, where, own);
  validate_job(job, own, &where);
  if (where_out != nullptr) *where_out = std::move(where);
  return job;
}

void located_errors(const SourceMap& where, const std::function<void()>& work) {
  const auto located = [&](const std::string& message) {
    const size_t colon = message.find(": ");
    if (colon == std::string::npos || colon == 0) return message;
    std::string_view key(message.data(), colon);
    if (key.find_first_of(" /\\") != std::string_view::npos) return message;  // not a key
    // The key, else the nearest enclosing one the job wrote ("optimizer.freeze" for
    // "optimizer.freeze[1]"), short of a whole section: a default was not written.
    for (;;) {
      const auto it = where.find(key);
      if (it != where.end() && (it->second.line > 0 || it->second.origin.rfind("--set", 0) == 0))
        return it->second.str() + ": " + message;
      const size_t cut = key.find_last_of(".[");
      if (cut == std::string_view::npos || cut == 0) return message;
      key = key.substr(0, cut);
      if (key.find_first_of(".[") == std::string_view::npos) return message;  // a section
    }
  };
  try {
    work();
  } catch (const RunError& e) {
    throw RunError(located(e.message()), e.hint());
  } catch (const Error& e) {
    throw Error(located(e.message()), e.hint());
  }
}

Job load_job_file(const std::string& path, const std::vector<std::string>& overrides,
                  const ValidateContext& ctx, SourceMap* where) {
  return load_job_text(read_job_file(path), path, overrides, ctx, where);
}

}  // namespace dtrain::config
