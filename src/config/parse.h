// Internal steps of loading a job (load.cpp runs them in this order): --set
// overrides on the document, the typed walk over the schema, and the derived
// defaults that depend on other keys or the world size.
#pragma once

#include <string_view>

#include "config/config.h"
#include "config/tree.h"

namespace dtrain::config {

// `spec` is "key.path=value"; the value is read as YAML (scalar or flow collection).
void apply_override(ConfigNode& root, std::string_view spec);

// Fills `job` from the document; where[path] = the position of every key written.
// where[""] must already hold the document's origin.
void parse_job(const ConfigNode& root, Job& job, SourceMap& where);

// Fills what the job left out and depends on other keys: model presets and dataset
// shapes, loss-scale mode, data-parallel size, micro-batching, checkpoint dir.
void resolve_job(Job& job, const SourceMap& where, const ValidateContext& ctx);

// Where to point a message about `path`: the key itself, else its nearest written
// parent, else the document.
SourceLoc locate(const SourceMap* where, std::string_view path);

}  // namespace dtrain::config
