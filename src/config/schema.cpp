// The job schema: every key with its type and range, in the order `dtrain validate`
// prints them. Defaults are the option structs' member initialisers; derived
// defaults (data-parallel size, model presets, ...) are filled in by resolve.cpp.
#include <limits>

#include "config/fields.h"
#include "config/suggest.h"
#include "core/error.h"

namespace dtrain::config {
namespace {

#define AT(member) \
  [](Job & j) -> auto& { return j.member; }

constexpr IntRange kPositive{1};
constexpr IntRange kNonNegative{0};
constexpr RealRange kPositiveReal{};
constexpr RealRange kNonNegativeReal{0, std::numeric_limits<double>::infinity(), false, true};
constexpr RealRange kFraction{0, 1, false, true};      // [0, 1)
constexpr RealRange kOpenFraction{0, 1, true, false};  // (0, 1]

Field betas_field() {
  auto read = [](const ConfigNode& n, const std::string& path) {
    if (n.kind != ConfigNode::Kind::list || n.items.size() != 2) {
      fail(
          n.loc, path,
          fmt::format("expected a list of two numbers in [0, 1), got {}",
                      n.kind == ConfigNode::Kind::list ? fmt::format("a list of {}", n.items.size())
                                                       : describe(n)),
          "e.g. betas: [0.9, 0.999]");
    }
    std::array<double, 2> b{};
    for (size_t i = 0; i < 2; ++i)
      b[i] = read_real(n.items[i], fmt::format("{}[{}]", path, i), kFraction);
    return b;
  };
  auto print = [](const std::array<double, 2>& b) {
    return fmt::format("[{}, {}]", format_real(b[0]), format_real(b[1]));
  };
  return leaf("betas", AT(optimizer.betas), read, print);
}

// data.augment.scale and .ratio: [low, high], 0 < low <= high (<= 1 where `fraction`).
template <class Acc>
Field range_field(std::string key, Acc acc, bool fraction, std::string example) {
  auto read = [fraction, example](const ConfigNode& n, const std::string& path) {
    const char* what = fraction ? "in (0, 1]" : "in [0.01, 100]";
    if (n.kind != ConfigNode::Kind::list || n.items.size() != 2) {
      fail(
          n.loc, path,
          fmt::format("expected a list of two numbers {}, low then high, got {}", what,
                      n.kind == ConfigNode::Kind::list ? fmt::format("a list of {}", n.items.size())
                                                       : describe(n)),
          fmt::format("e.g. {}", example));
    }
    std::array<double, 2> r{};
    for (size_t i = 0; i < 2; ++i) {
      r[i] = read_real(n.items[i], fmt::format("{}[{}]", path, i),
                       fraction ? kOpenFraction : RealRange{0.01, 100, false, false});
    }
    if (r[0] > r[1]) {
      fail(n.loc, path, fmt::format("low {} is over high {}", format_real(r[0]), format_real(r[1])),
           fmt::format("e.g. {}", example));
    }
    return r;
  };
  auto print = [](const std::array<double, 2>& r) {
    return fmt::format("[{}, {}]", format_real(r[0]), format_real(r[1]));
  };
  return leaf(std::move(key), acc, read, print);
}

// parallel.pipeline_blocks: [3, 5], the model blocks of each stage in order.
Field pipeline_blocks_field() {
  auto read = [](const ConfigNode& n, const std::string& path) {
    if (n.kind != ConfigNode::Kind::list || n.items.empty()) {
      fail(n.loc, path,
           fmt::format("expected a list of positive block counts, got {}", describe(n)),
           "e.g. pipeline_blocks: [3, 5] (one entry per stage, summing to the model's blocks)");
    }
    std::vector<int> blocks;
    for (size_t i = 0; i < n.items.size(); ++i)
      blocks.push_back(
          static_cast<int>(read_int(n.items[i], fmt::format("{}[{}]", path, i), kPositive)));
    return blocks;
  };
  auto print = [](const std::vector<int>& b) { return fmt::format("[{}]", fmt::join(b, ", ")); };
  return leaf("pipeline_blocks", AT(parallel.pipeline_blocks), read, print);
}

// A pattern listed twice in `list` (read into `patterns`) is refused at the second: a
// leftover, or a typo of the one meant.
void refuse_repeated(const ConfigNode& list, const std::vector<std::string>& patterns,
                     const std::string& path) {
  for (size_t i = 1; i < patterns.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (patterns[i] != patterns[j]) continue;
      fail(list.items[i].loc, fmt::format("{}[{}]", path, i),
           fmt::format("\"{}\" repeats {}[{}]", patterns[i], path, j), "list each pattern once");
    }
  }
}

Field freeze_field() {
  auto read = [](const ConfigNode& n, const std::string& path) {
    if (n.kind == ConfigNode::Kind::null) return std::vector<std::string>{};  // `freeze:`
    if (n.kind != ConfigNode::Kind::list) {
      fail(n.loc, path,
           fmt::format("expected a list of parameter name patterns, got {}", describe(n)),
           "e.g. freeze: [conv1, bn1, layer1, \"*.bias\"] (a module's name covers its "
           "parameters; * matches any characters: quote a pattern that starts with it)");
    }
    std::vector<std::string> patterns;
    for (size_t i = 0; i < n.items.size(); ++i) {
      patterns.push_back(read_string(n.items[i], fmt::format("{}[{}]", path, i)));
    }
    refuse_repeated(n, patterns, path);
    return patterns;
  };
  auto print = [](const std::vector<std::string>& v) {
    std::vector<std::string> quoted;
    for (const std::string& s : v) quoted.push_back(quote_string(s));
    return fmt::format("[{}]", fmt::join(quoted, ", "));
  };
  return leaf("freeze", AT(optimizer.freeze), read, print);
}

// optimizer.groups: [{params: [PATTERN...], lr_scale: X, weight_decay: Y}, ...].
Field groups_field() {
  static const std::vector<std::string> kKeys = {"params", "lr_scale", "weight_decay"};
  const std::string example =
      "e.g. groups: [{params: [heads], lr_scale: 10}, {params: [\"*.bias\", \"*norm*\"], "
      "weight_decay: 0}] (patterns as optimizer.freeze's; the first group that matches a "
      "parameter decides it)";
  // A scalar reader's refusal, given the example as its hint.
  const auto hinted = [example](const auto& read_one) {
    try {
      return read_one();
    } catch (const Error& e) {
      if (!e.hint().empty()) throw;
      throw Error(e.message(), example);
    }
  };
  auto read = [example, hinted](const ConfigNode& n, const std::string& path) {
    std::vector<OptimizerOptions::Group> groups;
    if (n.kind == ConfigNode::Kind::null) return groups;  // `groups:`
    if (n.kind != ConfigNode::Kind::list)
      fail(n.loc, path, fmt::format("expected a list of groups, got {}", describe(n)), example);
    for (size_t i = 0; i < n.items.size(); ++i) {
      const ConfigNode& item = n.items[i];
      const std::string at = fmt::format("{}[{}]", path, i);
      if (item.kind != ConfigNode::Kind::map) {
        fail(item.loc, at, fmt::format("expected a group (a mapping), got {}", describe(item)),
             example);
      }
      OptimizerOptions::Group g;
      bool has_params = false;
      for (const Entry& e : item.entries) {
        const std::string key = at + "." + e.key;
        if (e.key == "params") {
          if (e.value.kind != ConfigNode::Kind::list || e.value.items.empty()) {
            fail(e.value.loc, key,
                 fmt::format("expected a non-empty list of parameter name patterns, got {}",
                             e.value.kind == ConfigNode::Kind::list ? std::string("an empty list")
                                                                    : describe(e.value)),
                 example);
          }
          for (size_t k = 0; k < e.value.items.size(); ++k) {
            const std::string at_k = fmt::format("{}[{}]", key, k);
            g.params.push_back(hinted([&] { return read_string(e.value.items[k], at_k); }));
          }
          refuse_repeated(e.value, g.params, key);
          has_params = true;
        } else if (e.key == "lr_scale") {
          if (e.value.kind != ConfigNode::Kind::null)
            g.lr_scale = hinted([&] { return read_real(e.value, key, kPositiveReal); });
        } else if (e.key == "weight_decay") {
          if (e.value.kind != ConfigNode::Kind::null)
            g.weight_decay = hinted([&] { return read_real(e.value, key, kNonNegativeReal); });
        } else {
          fail(e.key_loc, key, fmt::format("unknown key{}", did_you_mean(e.key, kKeys)),
               "a group takes params, lr_scale and weight_decay");
        }
      }
      if (!has_params)
        fail(item.loc, at + ".params", "missing: the patterns of the group", example);
      if (!g.lr_scale && !g.weight_decay) {
        fail(item.loc, at, "the group sets nothing",
             "give it lr_scale (its learning rate's factor) or weight_decay (its decay, in place "
             "of optimizer.weight_decay and no_decay), or drop it");
      }
      groups.push_back(std::move(g));
    }
    return groups;
  };
  auto print = [](const std::vector<OptimizerOptions::Group>& groups) {
    std::vector<std::string> out;
    for (const OptimizerOptions::Group& g : groups) {
      std::vector<std::string> quoted;
      for (const std::string& p : g.params) quoted.push_back(quote_string(p));
      std::string one = fmt::format("{{params: [{}]", fmt::join(quoted, ", "));
      if (g.lr_scale) one += ", lr_scale: " + format_real(*g.lr_scale);
      if (g.weight_decay) one += ", weight_decay: " + format_real(*g.weight_decay);
      out.push_back(one + "}");
    }
    return fmt::format("[{}]", fmt::join(out, ", "));
  };
  return leaf("groups", AT(optimizer.groups), read, print);
}

Field device_field() {
  auto read = [](const ConfigNode& n, const std::string& path) {
    const std::string s = read_string(n, path);
    try {
      return Device::parse(s);
    } catch (const Error& e) {
      fail(n.loc, path, e.message(), e.hint());
    }
  };
  return leaf("device", AT(device), read, [](const Device& d) { return d.str(); });
}

// model.stem: an enum that, like every model key, stays null for the archs
// that do not use it (enumeration() takes only non-optional members).
Field stem_field() {
  std::vector<std::string> choices;
  for (const auto& [e, name] : enum_names(ResNetStem{})) choices.emplace_back(name);
  auto read = [choices](const ConfigNode& n, const std::string& path) {
    ResNetStem stem{};
    from_string(read_word(n, path, choices), stem);
    return stem;
  };
  return leaf("stem", AT(model.stem), read, [](ResNetStem s) { return std::string(to_string(s)); });
}

Field run_section() {
  return section("run", {text("name", AT(run.name)), text("output_dir", AT(run.output_dir)),
                         integer("seed", AT(run.seed), kNonNegative)});
}

Field model_section() {
  return section(
      "model",
      {required(text("arch", AT(model.arch))),
       integer("num_classes", AT(model.num_classes), kPositive),
       integer("image_size", AT(model.image_size), kPositive),
       integer("in_channels", AT(model.in_channels), kPositive), stem_field(),
       real("width", AT(model.width), RealRange{0, 64, true, false}),
       boolean("zero_init_residual", AT(model.zero_init_residual)),
       integer("patch_size", AT(model.patch_size), kPositive),
       integer("seq_len", AT(model.seq_len), kPositive),
       integer("max_positions", AT(model.max_positions), kPositive),
       integer("vocab_size", AT(model.vocab_size), kPositive),
       integer("layers", AT(model.layers), kPositive),
       integer("hidden", AT(model.hidden), kPositive), integer("heads", AT(model.heads), kPositive),
       integer("ffn", AT(model.ffn), kPositive), real("dropout", AT(model.dropout), kFraction),
       real("label_smoothing", AT(model.label_smoothing), kFraction),
       text("init_from", AT(model.init_from))});
}

Field data_section() {
  Field augment = section(
      "augment", {integer("crop_padding", AT(data.augment.crop_padding), IntRange{0, 64}),
                  boolean("flip", AT(data.augment.flip)),
                  range_field("scale", AT(data.augment.scale), true, "scale: [0.08, 1.0]"),
                  range_field("ratio", AT(data.augment.ratio), false, "ratio: [0.75, 1.3333333]")});
  Field limit = section("limit", {integer("train", AT(data.limit.train), kPositive),
                                  integer("test", AT(data.limit.test), kPositive)});
  return section("data",
                 {enumeration("dataset", AT(data.dataset)), text("path", AT(data.path)),
                  integer("global_batch", AT(data.global_batch), kPositive),
                  integer("micro_batch", AT(data.micro_batch), kPositive),
                  integer("workers", AT(data.workers), IntRange{0, 256}),
                  integer("prefetch", AT(data.prefetch), IntRange{1, 64}),
                  boolean("shuffle", AT(data.shuffle)), boolean("drop_last", AT(data.drop_last)),
                  std::move(augment), real("center_crop", AT(data.center_crop), kOpenFraction),
                  real("holdout", AT(data.holdout), RealRange{0, 1, true, true}),
                  enumeration("unreadable", AT(data.unreadable)), std::move(limit),
                  real("mlm_probability", AT(data.mlm_probability), RealRange{0, 1, true, true})});
}

Field optimizer_section() {
  Field schedule = section(
      "schedule", {enumeration("name", AT(optimizer.schedule.name)),
                   integer("warmup_steps", AT(optimizer.schedule.warmup_steps), kNonNegative),
                   integer("step_size", AT(optimizer.schedule.step_size), kPositive),
                   real("gamma", AT(optimizer.schedule.gamma), kOpenFraction),
                   real("min_lr", AT(optimizer.schedule.min_lr), kNonNegativeReal)});
  Field ema = section("ema", {real("decay", AT(optimizer.ema.decay), RealRange{0, 1, true, true}),
                              boolean("warmup", AT(optimizer.ema.warmup))});
  return section(
      "optimizer",
      {enumeration("name", AT(optimizer.name)), real("lr", AT(optimizer.lr), kPositiveReal),
       real("momentum", AT(optimizer.momentum), kFraction),
       boolean("nesterov", AT(optimizer.nesterov)), betas_field(),
       real("eps", AT(optimizer.eps), kPositiveReal),
       real("weight_decay", AT(optimizer.weight_decay), kNonNegativeReal),
       enumeration("no_decay", AT(optimizer.no_decay)),
       real("clip_grad_norm", AT(optimizer.clip_grad_norm), kPositiveReal), std::move(schedule),
       std::move(ema), freeze_field(),
       real("layer_decay", AT(optimizer.layer_decay), RealRange{0, 1, true, false}),
       groups_field()});
}

Field train_section() {
  Field checkpoint = section("checkpoint", {integer("every", AT(train.checkpoint.every), kPositive),
                                            integer("keep", AT(train.checkpoint.keep), kPositive),
                                            text("dir", AT(train.checkpoint.dir))});
  Field best = section("best", {enumeration("metric", AT(train.best.metric)),
                                boolean("keep_checkpoint", AT(train.best.keep_checkpoint)),
                                integer("patience", AT(train.best.patience), kNonNegative),
                                real("min_delta", AT(train.best.min_delta), kNonNegativeReal)});
  return section(
      "train",
      {integer("steps", AT(train.steps), kPositive), integer("epochs", AT(train.epochs), kPositive),
       integer("eval_every", AT(train.eval_every), kPositive),
       integer("log_every", AT(train.log_every), kPositive), std::move(checkpoint), std::move(best),
       text("resume", AT(train.resume))});
}

Field precision_section() {
  Field scale = section(
      "loss_scale",
      {enumeration("mode", AT(precision.loss_scale.mode)),
       real("init", AT(precision.loss_scale.init), kPositiveReal),
       integer("growth_interval", AT(precision.loss_scale.growth_interval), kPositive),
       real("growth_factor", AT(precision.loss_scale.growth_factor),
            RealRange{1, std::numeric_limits<double>::infinity(), true, true}),
       real("backoff_factor", AT(precision.loss_scale.backoff_factor), RealRange{0, 1, true, true}),
       real("min", AT(precision.loss_scale.min), kPositiveReal),
       real("max", AT(precision.loss_scale.max), kPositiveReal),
       integer("hysteresis", AT(precision.loss_scale.hysteresis), kPositive),
       enumeration("on_min", AT(precision.loss_scale.on_min))});
  return section("precision", {enumeration("dtype", AT(precision.dtype)),
                               boolean("master_weights", AT(precision.master_weights)),
                               boolean("tf32", AT(precision.tf32)), std::move(scale)});
}

Field parallel_section() {
  return section("parallel", {integer_or_auto("data", AT(parallel.data), kPositive),
                              integer("tensor", AT(parallel.tensor), kPositive),
                              integer("pipeline", AT(parallel.pipeline), kPositive),
                              enumeration("schedule", AT(parallel.schedule)),
                              pipeline_blocks_field(), enumeration("order", AT(parallel.order)),
                              integer("micro_batches", AT(parallel.micro_batches), kPositive),
                              integer("zero_stage", AT(parallel.zero_stage), IntRange{0, 3})});
}

Field comm_section() {
  return section("comm", {enumeration("backend", AT(comm.backend)),
                          enumeration("allreduce", AT(comm.allreduce)),
                          real("bucket_mb", AT(comm.bucket_mb), RealRange{0, 4096, true, false}),
                          boolean("overlap", AT(comm.overlap)),
                          integer("ranks_per_node", AT(comm.ranks_per_node), kPositive),
                          real("timeout_s", AT(comm.timeout_s), kPositiveReal)});
}

Field compress_section() {
  return section("compress", {enumeration("method", AT(compress.method)),
                              real("ratio", AT(compress.ratio), kOpenFraction),
                              integer("rank", AT(compress.rank), kPositive),
                              boolean("error_feedback", AT(compress.error_feedback)),
                              integer("warmup_steps", AT(compress.warmup_steps), kNonNegative),
                              enumeration("exchange", AT(compress.exchange))});
}

Field memory_section() {
  Field offload = section("offload", {boolean("optimizer", AT(memory.offload.optimizer)),
                                      boolean("params", AT(memory.offload.params))});
  return section("memory", {enumeration("checkpointing", AT(memory.checkpointing)),
                            integer("every_k", AT(memory.every_k), kPositive), std::move(offload),
                            boolean("pool", AT(memory.pool))});
}

Field logging_section() {
  Field profile = section("profile", {integer("start", AT(logging.profile.start), kNonNegative),
                                      integer("steps", AT(logging.profile.steps), kNonNegative)});
  Field samples =
      section("samples", {integer("every", AT(logging.samples.every), kNonNegative),
                          text("prompt", AT(logging.samples.prompt)),
                          integer("tokens", AT(logging.samples.tokens), kPositive),
                          integer("count", AT(logging.samples.count), kPositive),
                          real("temperature", AT(logging.samples.temperature), kNonNegativeReal),
                          integer("top_k", AT(logging.samples.top_k), kNonNegative)});
  return section(
      "logging",
      {boolean("console", AT(logging.console)), boolean("jsonl", AT(logging.jsonl)),
       boolean("tensorboard", AT(logging.tensorboard)), std::move(profile), std::move(samples)});
}

#undef AT

}  // namespace

const Field& job_schema() {
  static const Field root =
      section("", {run_section(), model_section(), data_section(), optimizer_section(),
                   train_section(), precision_section(), parallel_section(), comm_section(),
                   compress_section(), memory_section(), device_field(), logging_section()});
  return root;
}

}  // namespace dtrain::config
