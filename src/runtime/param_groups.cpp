// optimizer.freeze, optimizer.layer_decay and optimizer.groups: see param_groups.h.
#include "runtime/param_groups.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

namespace {

// What a pattern list needs to know of the model: its layout and each parameter's names
// in the reference implementation (runtime/export_names.h), which a pattern may use
// too (none for a model without an export plan).
struct Names {
  const std::vector<graph::FlatEntry>& layout;
  std::vector<std::vector<std::string>> exported;
  bool has_family = false;
  ModelFamily family{};
  std::string arch;
};

// The parameters `patterns` cover (per param_layout() entry), each pattern's count in
// `per_pattern` ("pattern (n)"). `key`: the list's config path, for the messages; `verb`:
// what the list does to a parameter ("freeze", "name"). Exit 2 (Error) for a pattern
// that matches nothing, and for patterns covering some but not all of the reference
// tensors dtrain holds in one (BERT's query, key and value).
std::vector<uint8_t> cover(const std::vector<std::string>& patterns, const std::string& key,
                           const char* verb, const Names& names,
                           std::vector<std::string>& per_pattern,
                           std::vector<std::string>& warnings) {
  const std::vector<graph::FlatEntry>& layout = names.layout;
  std::vector<uint8_t> hit(layout.size(), 0);
  // A reference name is covered when any pattern matches it; a tensor holding several
  // must have all of them covered, or none.
  const auto matches_any = [&](const std::string& name) {
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](const std::string& pattern) { return pattern_matches(pattern, name); });
  };
  std::vector<uint8_t> whole(layout.size(), 0);  // every exported name of it covered
  for (size_t p = 0; p < layout.size(); ++p) {
    std::vector<std::string> in, out;
    for (const std::string& n : names.exported[p]) (matches_any(n) ? in : out).push_back(n);
    if (!in.empty() && !out.empty()) {
      throw Error(
          fmt::format("{}: the patterns match {} but not {}, which dtrain holds in one "
                      "tensor with it ({})",
                      key, fmt::join(in, ", "), fmt::join(out, ", "), layout[p].name),
          fmt::format("{} the whole tensor: cover them all, or name {}", verb, layout[p].name));
    }
    whole[p] = !in.empty() ? 1 : 0;
  }
  struct TiedName {
    size_t pattern;
    const char* copy;
    const char* embedding;
  };
  std::vector<TiedName> tied;  // patterns covering a tied copy's name
  // BERT ties its decoder to the word table only with the masked-LM head ("cls.*"); a
  // classifier has none.
  const bool bert_lm_head = std::any_of(layout.begin(), layout.end(),
                                        [](const auto& e) { return e.name.rfind("cls.", 0) == 0; });
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& pattern = patterns[i];
    int hits = 0;
    for (size_t p = 0; p < layout.size(); ++p) {
      bool match = pattern_matches(pattern, layout[p].name);
      for (size_t k = 0; !match && whole[p] && k < names.exported[p].size(); ++k)
        match = pattern_matches(pattern, names.exported[p][k]);
      if (!match) continue;
      ++hits;
      hit[p] = 1;
    }
    // Hugging Face's copies of a weight tied to the word embedding, held once here.
    struct Tied {
      ModelFamily family;
      const char* copy;
      const char* embedding;
    };
    static constexpr Tied kTied[] = {
        {ModelFamily::gpt, "lm_head.weight", "transformer.wte"},
        {ModelFamily::bert, "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings"}};
    if (hits > 0) {  // a module pattern ("cls") that takes in the tied copy's name too
      for (const auto& [family, copy, embedding] : kTied) {
        if (names.has_family && family == names.family && pattern_matches(pattern, copy) &&
            (family != ModelFamily::bert || bert_lm_head))
          tied.push_back({i, copy, embedding});
      }
    }
    if (hits == 0) {
      for (const auto& [family, copy, embedding] : kTied) {
        if (!names.has_family || family != names.family || !pattern_matches(pattern, copy))
          continue;
        throw Error(fmt::format("{}[{}]: \"{}\" names {}, which {} ties to the word embedding "
                                "and dtrain holds once",
                                key, i, pattern, copy, names.arch),
                    fmt::format("{} {} (it is the output layer too)", verb, embedding));
      }
      throw Error(
          fmt::format("{}[{}]: \"{}\" matches no parameter of {}", key, i, pattern, names.arch),
          fmt::format("a pattern names a parameter or a module (its name cut at a dot, "
                      "e.g. layer1 or encoder.layer.0), as `dtrain ckpt inspect` or "
                      "`dtrain ckpt export` names them, * matching any characters; {}'s "
                      "modules: {}",
                      names.arch, modules_of(layout)));
    }
    per_pattern.push_back(fmt::format("{} ({})", pattern, hits));
  }
  for (const auto& [i, copy, embedding] : tied) {  // warned unless another pattern takes it
    bool embedding_hit = false;
    for (size_t p = 0; p < layout.size(); ++p)
      for (const std::string& n : names.exported[p])
        embedding_hit = embedding_hit || (hit[p] && pattern_matches(embedding, n));
    if (embedding_hit) continue;
    warnings.push_back(fmt::format(
        "{}[{}]: \"{}\" covers {} by name, but that is the word embedding ({} ties them and "
        "dtrain holds it once), which the patterns leave out; {} {} to include it",
        key, i, patterns[i], copy, names.arch, verb, embedding));
  }
  return hit;
}

}  // namespace

ParamGroups::ParamGroups(const OptimizerOptions& options, const graph::Graph& graph,
                         const std::string& arch) {
  const std::vector<graph::FlatEntry>& layout = graph.param_layout();
  Names names{layout, std::vector<std::vector<std::string>>(layout.size()), false, {}, arch};
  if (!options.freeze.empty() || !options.groups.empty()) {
    try {
      names.family = family_of(arch);
      names.has_family = true;
      for (const ExportTensor& t : export_plan(names.family, layout, graph.buffer_layout()))
        if (t.store == StoreKind::params && t.entry >= 0)
          names.exported[static_cast<size_t>(t.entry)].push_back(t.name);
    } catch (const Error&) {
      // dtrain's own names alone
    }
  }
  std::vector<std::string> per_pattern, warnings;
  frozen_ = cover(options.freeze, "optimizer.freeze", "freeze", names, per_pattern, warnings);
  int64_t frozen_elems = 0, all_elems = 0;
  for (size_t p = 0; p < layout.size(); ++p) {
    const int64_t n = layout[p].spec.shape.numel();
    all_elems += n;
    if (frozen_[p]) {
      frozen_names_.insert(layout[p].name);
      frozen_list_.push_back(layout[p].name);
      frozen_exported_.insert(names.exported[p].begin(), names.exported[p].end());
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
  // optimizer.groups: the first group whose patterns match a parameter decides it.
  std::vector<int> group_of(layout.size(), -1);
  for (size_t i = 0; i < options.groups.size(); ++i) {
    const OptimizerOptions::Group& g = options.groups[i];
    const std::string key = fmt::format("optimizer.groups[{}]", i);
    std::vector<std::string> matched;
    const std::vector<uint8_t> hit =
        cover(g.params, key + ".params", "name", names, matched, warnings);
    int tensors = 0, taken = 0, frozen = 0, first_taker = -1;
    int64_t elems = 0;
    for (size_t p = 0; p < layout.size(); ++p) {
      if (!hit[p]) continue;
      if (group_of[p] >= 0) {
        ++taken;
        if (first_taker < 0) first_taker = group_of[p];
        continue;
      }
      group_of[p] = static_cast<int>(i);
      ++tensors;
      frozen += frozen_[p];
      elems += layout[p].spec.shape.numel();
    }
    if (tensors == 0) {
      throw Error(fmt::format("{}: every parameter its patterns match ({}) belongs to an earlier "
                              "group (optimizer.groups[{}] is the first of them)",
                              key, taken, first_taker),
                  "the first group that matches a parameter decides it: put the narrower group "
                  "first, or drop this one");
    }
    if (g.lr_scale && !(options.lr * *g.lr_scale < std::numeric_limits<float>::max())) {
      throw Error(fmt::format("{}.lr_scale: {} x optimizer.lr {} is beyond what an f32 learning "
                              "rate holds",
                              key, *g.lr_scale, options.lr),
                  "a group's learning rate is optimizer.lr x lr_scale: give a factor such as 10");
    }
    if (g.lr_scale && options.lr > 0 &&
        options.lr * *g.lr_scale < std::numeric_limits<float>::min()) {
      throw Error(fmt::format("{}.lr_scale: {} x optimizer.lr {} rounds to a learning rate of 0 "
                              "in f32",
                              key, *g.lr_scale, options.lr),
                  "to keep these parameters as they are, put them in optimizer.freeze");
    }
    std::vector<std::string> sets;
    if (g.lr_scale) sets.push_back(fmt::format("learning rate x {}", *g.lr_scale));
    if (g.weight_decay) sets.push_back(fmt::format("weight decay {}", *g.weight_decay));
    lines_.push_back(
        fmt::format("{}: {} tensors ({} parameters{}): {}{}; {}", key, tensors, elems,
                    frozen > 0 ? fmt::format("; {} of the tensors frozen", frozen) : std::string(),
                    fmt::join(matched, ", "),
                    taken > 0 ? fmt::format(", {} more in earlier groups", taken) : std::string(),
                    fmt::join(sets, ", ")));
    if (frozen == tensors) {
      warnings.push_back(fmt::format(
          "{}: every tensor it decides is frozen (optimizer.freeze): its settings change nothing",
          key));
    }
  }
  for (const std::string& w : warnings) lines_.push_back("warning: " + w);
  const std::vector<int> layers = param_layers(graph);
  const int top = graph.num_blocks() + 1;
  for (size_t p = 0; p < layout.size(); ++p) {
    double s = frozen_[p] ? 0.0 : 1.0;
    if (options.layer_decay && s > 0)
      s = std::pow(*options.layer_decay, static_cast<double>(top - layers[p]));
    if (group_of[p] >= 0) {
      const OptimizerOptions::Group& g = options.groups[static_cast<size_t>(group_of[p])];
      if (g.lr_scale) s *= *g.lr_scale;
      if (g.weight_decay) decay_.emplace(layout[p].name, *g.weight_decay);
    }
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

std::optional<double> ParamGroups::weight_decay(const std::string& name) const {
  const auto it = decay_.find(name);
  return it == decay_.end() ? std::nullopt : std::optional<double>(it->second);
}

std::vector<optim::ParamSegment> segments_of(const std::vector<graph::FlatEntry>& layout,
                                             NoDecayGroups rule, const ParamGroups& groups) {
  std::vector<optim::ParamSegment> segs;
  for (const graph::FlatEntry& e : layout) {
    const graph::ParamGroup g = e.spec.group;
    bool no_decay = false;
    if (rule != NoDecayGroups::none) {
      no_decay = g == graph::ParamGroup::norm || g == graph::ParamGroup::bias ||
                 (rule == NoDecayGroups::norm_bias_embedding && g == graph::ParamGroup::embedding);
    }
    segs.push_back({e.name, e.offset, e.spec.shape.numel(),
                    no_decay ? optim::DecayMode::no_decay : optim::DecayMode::decay,
                    groups.lr_scale(e.name), groups.frozen(e.name), groups.weight_decay(e.name)});
  }
  return segs;
}

std::vector<dist::Bucket> gradient_buckets(const std::vector<graph::FlatEntry>& layout,
                                           const graph::Graph& graph, const ParamGroups& groups,
                                           const graph::Stage* stage, bool frozen_too,
                                           size_t bucket_bytes, bool* all) {
  std::vector<dist::GradRange> ranges;
  for (const graph::FlatEntry& e : layout) ranges.push_back({e.offset, e.spec.shape.numel()});
  const int n = static_cast<int>(layout.size());
  std::vector<char> candidate(static_cast<size_t>(n), stage == nullptr ? 1 : 0);
  if (stage != nullptr)
    for (int p : graph::stage_param_indices(graph, *stage)) candidate[static_cast<size_t>(p)] = 1;
  // In layout order: each candidate sent unless frozen; a run of frozen ones between two
  // sent ones bridged when small.
  std::vector<char> sent(static_cast<size_t>(n), 0);
  const std::vector<uint8_t>& frozen = groups.frozen_mask();
  int last_sent = -1;
  size_t run_bytes = 0;
  for (int p = 0; p < n; ++p) {
    const auto i = static_cast<size_t>(p);
    if (candidate[i] == 0) continue;
    if (frozen_too || frozen.empty() || frozen[i] == 0) {
      if (last_sent >= 0 && run_bytes > 0 && run_bytes <= kBridgeBytes) {
        for (int q = last_sent + 1; q < p; ++q)
          if (candidate[static_cast<size_t>(q)] != 0) sent[static_cast<size_t>(q)] = 1;
      }
      sent[i] = 1;
      last_sent = p;
      run_bytes = 0;
    } else {
      run_bytes += static_cast<size_t>(layout[i].spec.shape.numel()) * sizeof(float);
    }
  }
  std::vector<int> which;
  for (int p = 0; p < n; ++p)
    if (sent[static_cast<size_t>(p)] != 0) which.push_back(p);
  const bool every = static_cast<int>(which.size()) == n;
  if (all != nullptr) *all = every;
  if (every) {
    return dist::plan_buckets(ranges, graph::FlatStore(layout).buffer_elems(DType::f32),
                              bucket_bytes);
  }
  return dist::plan_buckets_of(ranges, which, bucket_bytes);
}

std::vector<char> zero_gradients(const Job& job, const graph::Graph& graph,
                                 const ParamGroups& groups) {
  const ParallelOptions& p = job.parallel;
  const bool zero1 = p.zero_stage == 1 && p.data > 1, zero2 = p.zero_stage >= 2 && p.data > 1;
  if (p.pipeline > 1 || !groups.any_frozen() || zero1 || (!zero2 && !job.device.is_cpu())) {
    return {};
  }
  std::vector<graph::FlatEntry> entries = graph.param_layout();
  for (graph::FlatEntry& e : entries) e.spec.dtype = DType::f32;
  const std::vector<graph::FlatEntry> layout = graph::FlatStore(entries).entries();  // offsets
  const std::vector<dist::Bucket> buckets =
      gradient_buckets(layout, graph, groups, nullptr, false,
                       static_cast<size_t>(job.comm.bucket_mb * 1024.0 * 1024.0));
  std::vector<char> zero(groups.frozen_mask().begin(), groups.frozen_mask().end());
  for (const dist::Bucket& b : buckets)
    for (int q : b.params) zero[static_cast<size_t>(q)] = 0;
  if (std::find(zero.begin(), zero.end(), 1) == zero.end()) zero.clear();
  return zero;
}

std::vector<std::pair<int64_t, int64_t>> bucket_cover(const std::vector<dist::Bucket>& buckets,
                                                      int64_t lo, int64_t hi) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const dist::Bucket& b : buckets) spans.emplace_back(b.begin, b.end);
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> cover;
  for (const auto& [b, e] : spans) {
    const int64_t a = std::max(b, lo), z = std::min(e, hi);
    if (a >= z) continue;
    if (!cover.empty() && cover.back().second >= a) {
      cover.back().second = std::max(cover.back().second, z);
    } else {
      cover.emplace_back(a, z);
    }
  }
  return cover;
}

}  // namespace dtrain::runtime
