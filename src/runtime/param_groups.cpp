// optimizer.freeze and optimizer.layer_decay: see param_groups.h.
#include "runtime/param_groups.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "runtime/export_names.h"

namespace dtrain::runtime {
namespace {

// The whole of `s` against the glob `p` (* any run, ? one character).
bool glob(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// The name cut after its first `depth` components (the whole name if it has fewer).
std::string prefix(const std::string& name, int depth) {
  size_t at = 0;
  for (int d = 0; d < depth; ++d) {
    at = name.find('.', at == 0 && d == 0 ? 0 : at + 1);
    if (at == std::string::npos) return name;
  }
  return name.substr(0, at);
}

// The distinct modules at the first depth where names part (GPT-2's all start with
// "transformer"), in layout order: what a refusal offers.
std::string modules_of(const std::vector<graph::FlatEntry>& layout) {
  std::vector<std::string> out;
  for (int depth = 1; depth <= 4 && out.size() <= 1; ++depth) {
    out.clear();
    std::set<std::string> seen;
    for (const graph::FlatEntry& e : layout) {
      std::string top = prefix(e.name, depth);
      if (seen.insert(top).second) out.push_back(std::move(top));
    }
  }
  return fmt::format("{}", fmt::join(out, ", "));
}

}  // namespace

bool pattern_matches(std::string_view pattern, std::string_view name) {
  if (glob(pattern, name)) return true;
  for (size_t k = name.find('.'); k != std::string_view::npos; k = name.find('.', k + 1))
    if (glob(pattern, name.substr(0, k))) return true;
  return false;
}

std::vector<int> param_layers(const graph::Graph& graph) {
  const int blocks = graph.num_blocks();
  std::vector<int> layer(graph.param_layout().size(), -1);
  bool past_blocks = false;  // a node outside any block after one inside: the head's side
  bool in_blocks = false;
  for (const graph::Node& n : graph.nodes()) {
    if (n.block >= 0) in_blocks = true;
    if (n.block < 0 && in_blocks) past_blocks = true;
    const int l = n.block >= 0 ? n.block + 1 : (past_blocks ? blocks + 1 : 0);
    for (int p : n.params) {
      int& at = layer[static_cast<size_t>(p)];
      if (at < 0) at = l;  // the first use decides (a tied weight: its embedding's)
    }
  }
  for (int& l : layer)
    if (l < 0) l = blocks + 1;  // unused by any node: none in the built-in models
  return layer;
}

ParamGroups::ParamGroups(const OptimizerOptions& options, const graph::Graph& graph,
                         const std::string& arch) {
  const std::vector<graph::FlatEntry>& layout = graph.param_layout();
  frozen_.assign(layout.size(), 0);
  int64_t frozen_elems = 0, all_elems = 0;
  std::vector<std::string> per_pattern;
  // Each parameter's names in the reference implementation (runtime/export_names.h),
  // which a pattern may use too; none for a model without an export plan.
  std::vector<std::vector<std::string>> exported(layout.size());
  bool has_family = false;
  ModelFamily model_family{};
  if (!options.freeze.empty()) {
    try {
      model_family = family_of(arch);
      has_family = true;
      for (const ExportTensor& t : export_plan(model_family, layout, graph.buffer_layout()))
        if (t.store == StoreKind::params && t.entry >= 0)
          exported[static_cast<size_t>(t.entry)].push_back(t.name);
    } catch (const Error&) {
      // dtrain's own names alone
    }
  }
  // A reference name is covered when any pattern matches it; a tensor holding several
  // must have all of them covered, or none.
  const auto matches_any = [&](const std::string& name) {
    return std::any_of(options.freeze.begin(), options.freeze.end(),
                       [&](const std::string& pattern) { return pattern_matches(pattern, name); });
  };
  std::vector<uint8_t> whole(layout.size(), 0);  // every exported name of it covered
  for (size_t p = 0; p < layout.size(); ++p) {
    std::vector<std::string> in, out;
    for (const std::string& n : exported[p]) (matches_any(n) ? in : out).push_back(n);
    if (!in.empty() && !out.empty()) {
      throw Error(fmt::format("optimizer.freeze: the patterns match {} but not {}, which dtrain "
                              "holds in one tensor with it ({})",
                              fmt::join(in, ", "), fmt::join(out, ", "), layout[p].name),
                  "freeze the whole tensor: cover them all, or name " + layout[p].name);
    }
    whole[p] = !in.empty() ? 1 : 0;
  }
  for (size_t i = 0; i < options.freeze.size(); ++i) {
    const std::string& pattern = options.freeze[i];
    int hits = 0;
    for (size_t p = 0; p < layout.size(); ++p) {
      bool hit = pattern_matches(pattern, layout[p].name);
      for (size_t k = 0; !hit && whole[p] && k < exported[p].size(); ++k)
        hit = pattern_matches(pattern, exported[p][k]);
      if (!hit) continue;
      ++hits;
      frozen_[p] = 1;
    }
    if (hits == 0) {
      // Hugging Face's copies of a weight tied to the word embedding, held once here.
      struct Tied {
        ModelFamily family;
        const char* copy;
        const char* embedding;
      };
      static constexpr Tied kTied[] = {
          {ModelFamily::gpt, "lm_head.weight", "transformer.wte"},
          {ModelFamily::bert, "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings"}};
      for (const auto& [family, copy, embedding] : kTied) {
        if (!has_family || family != model_family || !pattern_matches(pattern, copy)) continue;
        throw Error(fmt::format("optimizer.freeze[{}]: \"{}\" names {}, which {} ties to the word "
                                "embedding and dtrain holds once",
                                i, pattern, copy, arch),
                    fmt::format("freeze {} (it is the output layer too)", embedding));
      }
      throw Error(
          fmt::format("optimizer.freeze[{}]: \"{}\" matches no parameter of {}", i, pattern, arch),
          fmt::format("a pattern names a parameter or a module (its name cut at a dot, "
                      "e.g. layer1 or encoder.layer.0), as `dtrain ckpt inspect` or `dtrain "
                      "ckpt export` names them, * matching any characters; {}'s modules: {}",
                      arch, modules_of(layout)));
    }
    per_pattern.push_back(fmt::format("{} ({})", pattern, hits));
  }
  for (size_t p = 0; p < layout.size(); ++p) {
    const int64_t n = layout[p].spec.shape.numel();
    all_elems += n;
    if (frozen_[p]) {
      frozen_names_.insert(layout[p].name);
      frozen_list_.push_back(layout[p].name);
      frozen_exported_.insert(exported[p].begin(), exported[p].end());
      frozen_elems += n;
    }
  }
  if (!layout.empty() && frozen_list_.size() == layout.size()) {
    throw Error(fmt::format("optimizer.freeze: the patterns cover every parameter of {}; nothing "
                            "would train",
                            arch),
                fmt::format("leave at least the head out of optimizer.freeze (a linear probe "
                            "freezes all but it); {}'s modules: {}",
                            arch, modules_of(layout)));
  }
  if (any_frozen()) {
    lines_.push_back(fmt::format(
        "optimizer.freeze: {} of {} tensors frozen ({} of {} parameters): {}; they keep their "
        "values (zero gradients, no update)",
        frozen_list_.size(), layout.size(), frozen_elems, all_elems, fmt::join(per_pattern, ", ")));
  }
  const std::vector<int> layers = param_layers(graph);
  const int top = graph.num_blocks() + 1;
  for (size_t p = 0; p < layout.size(); ++p) {
    double s = frozen_[p] ? 0.0 : 1.0;
    if (options.layer_decay && s > 0)
      s = std::pow(*options.layer_decay, static_cast<double>(top - layers[p]));
    scale_.emplace(layout[p].name, s);
  }
  if (options.layer_decay) {
    const double d = *options.layer_decay;
    lines_.push_back(fmt::format(
        "optimizer.layer_decay: {} over {} layers: the learning rate x {:.4g} before the first "
        "block (layer 0), x {}^({} - l) in block l (layers 1-{}), x 1 after the last block",
        d, top + 1, std::pow(d, static_cast<double>(top)), d, top, top - 1));
  }
}

double ParamGroups::lr_scale(const std::string& name) const {
  const auto it = scale_.find(name);
  return it == scale_.end() ? 1.0 : it->second;
}

bool ParamGroups::frozen(const std::string& name) const { return frozen_names_.count(name) > 0; }

}  // namespace dtrain::runtime
