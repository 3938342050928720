// `dtrain generate` (runtime/generate.h): weights into a forward-only GPT-2 graph, the
// prompt through it, then one draw per new token (cached steps, or graph forwards).
#include "runtime/generate.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "graph/executor.h"
#include "kernels/memory.h"
#include "models/registry.h"
#include "models/transformer.h"
#include "runtime/decoder.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"

namespace dtrain::runtime {
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kSamplingPurpose = 0x20;  // Philox stream: (seed, sample); word: 2 x token index
constexpr int64_t kShortestForward = 16;     // positions of the first, smallest graph

// The model's weights as one f32 buffer in the graph's parameter layout (an fp32
// graph's layout: every entry f32), read from a checkpoint or a safetensors file.
struct Weights {
  Tensor params;
  std::string source;
  int64_t step = -1;
};

constexpr const char* kWeightsHint =
    "pass --checkpoint: a checkpoint of this job's model (a step-N.dtckpt file, a step-N/ "
    "directory, a run directory) or a .safetensors file of its shape (dtrain ckpt export, "
    "Hugging Face GPT-2)";

// A safetensors file by its name, or by its first bytes: a u64 header length, then the
// header's '{' (a dtrain checkpoint starts with "DTRAINCK").
bool is_safetensors(const fs::path& path) {
  if (path.extension() == ".safetensors") return true;
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  return in.read(head, sizeof(head)) && std::string_view(head, 8) != "DTRAINCK" && head[8] == '{';
}

// The model's attention heads, which no tensor's shape shows, against the job's.
void check_heads(const std::string& source, int64_t heads, int64_t job_heads) {
  if (heads > 0 && heads != job_heads) {
    throw Error(fmt::format("{}: the model has {} attention heads, the job's model.heads is {}",
                            source, heads, job_heads),
                fmt::format("set model.heads: {} (--set model.heads={})", heads, heads));
  }
}

// Heads recorded beside a safetensors file: dtrain's export metadata, or the n_head of a
// Hugging Face config.json in the same directory; 0 when neither says.
int64_t recorded_heads(const fs::path& file, const std::map<std::string, std::string>& meta) {
  if (auto it = meta.find("heads"); it != meta.end()) {
    int64_t heads = 0;
    const std::string& v = it->second;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), heads);
    if (ec != std::errc() || end != v.data() + v.size() || heads < 1) {
      throw Error(fmt::format("{}: metadata heads \"{}\" is not a head count", file.string(), v),
                  kWeightsHint);
    }
    return heads;
  }
  const fs::path config = file.parent_path() / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return 0;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(config), nullptr, false);
  if (j.is_object() && j.contains("n_head") && j.at("n_head").is_number_integer())
    return j.at("n_head").get<int64_t>();
  return 0;
}

Weights from_safetensors(const fs::path& file, const Job& job, const graph::Graph& g,
                         int64_t job_heads) {
  InitWeights w;
  try {
    w = load_init_weights(file, job.model.arch, g.param_layout(), g.buffer_layout());
  } catch (const RunError&) {
    throw;
  } catch (const Error& e) {
    throw Error(e.message(), kWeightsHint);  // its own hint speaks of model.init_from
  }
  DTRAIN_CHECK(w.fresh.empty() && !w.buffers.defined(),
               "a GPT-2 has no task head and no buffers, but {} left {} fresh", file.string(),
               w.fresh.size());
  check_heads(file.string(), recorded_heads(file, w.metadata), job_heads);
  return {w.params, file.string(), -1};
}

Weights from_checkpoint(const fs::path& path, const Job& job, const graph::Graph& g,
                        int64_t job_heads) {
  Checkpoint ck;
  try {
    ck = read_any_checkpoint(path);
  } catch (const RunError&) {
    throw;
  } catch (const Error& e) {
    throw Error(e.message(), kWeightsHint);  // its own hint speaks of resuming
  }
  if (ck.meta.contains("model")) {
    const nlohmann::json& m = ck.meta.at("model");
    if (!m.is_object() || (m.contains("heads") && !m.at("heads").is_number_integer())) {
      throw Error(fmt::format("{}: its model metadata {} is not dtrain's", path.string(), m.dump()),
                  kWeightsHint);
    }
    check_heads(path.string(), m.value("heads", int64_t{0}), job_heads);
  }
  const std::vector<NamedTensor> tensors = checkpoint_model_tensors(ck);
  std::map<std::string, const Tensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t.tensor;
  const std::string hint =
      "generate with the job file of the run that wrote it (its job.yaml has the model.* keys)";
  const graph::FlatStore layout(g.param_layout());
  Weights w;
  w.params = Tensor::empty({layout.buffer_elems(DType::f32)}, DType::f32);
  std::fill_n(w.params.data<float>(), w.params.numel(), 0.0f);
  for (const graph::FlatEntry& e : layout.entries()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      throw Error(fmt::format("{}: the job's model ({}) has a tensor {} that the checkpoint "
                              "lacks: the run's model.* keys differ from the job's",
                              path.string(), job.model.arch, e.name),
                  hint);
    }
    const Tensor& t = *it->second;
    if (!(t.shape() == e.spec.shape)) {
      throw Error(
          fmt::format("{}: tensor {} is {} in the checkpoint, {} in the job's model ({})",
                      path.string(), e.name, t.shape().str(), e.spec.shape.str(), job.model.arch),
          hint);
    }
    std::copy_n(t.data<float>(), t.numel(), w.params.data<float>() + e.offset);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    throw Error(fmt::format("{}: the checkpoint's tensor {} is not part of the job's model ({})",
                            path.string(), by_name.begin()->first, job.model.arch),
                hint);
  }
  w.source = path.string();
  w.step = ck.meta.value("step", int64_t{-1});
  return w;
}

Weights read_weights(const GenerateRequest& r, const graph::Graph& g, int64_t heads) {
  const Job& job = r.job;
  if (!r.weights.empty() && r.weights != "latest") {
    std::error_code ec;
    if (fs::is_regular_file(r.weights, ec) && is_safetensors(r.weights))
      return from_safetensors(r.weights, job, g, heads);
    fs::path path;
    try {
      path = resolve_resume(r.weights, job.train.checkpoint.dir, "--checkpoint");
    } catch (const Error& e) {
      throw Error(e.message(), kWeightsHint);
    }
    return from_checkpoint(path, job, g, heads);
  }
  const fs::path newest = resolve_resume("latest", job.train.checkpoint.dir, "--checkpoint");
  if (!newest.empty()) return from_checkpoint(newest, job, g, heads);
  if (job.model.init_from) return from_safetensors(*job.model.init_from, job, g, heads);
  throw Error(fmt::format("no checkpoint in {} (train.checkpoint.dir) to generate from",
                          job.train.checkpoint.dir),
              "train the job first (dtrain train), or pass --checkpoint PATH: a checkpoint, a "
              "run directory or a .safetensors file");
}

// data.path's tokenizer.json, or --tokenizer: a tokenizer.json, or a directory holding
// one or Hugging Face GPT-2's vocab.json and merges.txt.
Tokenizer read_tokenizer(const GenerateRequest& r) {
  constexpr const char* kHint =
      "pass --tokenizer: the tokenizer.json `dtrain data tokenize` wrote, or a directory with "
      "GPT-2's vocab.json and merges.txt";
  fs::path file = r.tokenizer;
  if (file.empty()) {
    if (!r.job.data.path || r.job.data.dataset != DatasetName::tokens) {
      throw Error(
          "generate needs the tokenizer of the model's training text, and the job's data "
          "has none (data.dataset is not tokens)",
          kHint);
    }
    file = fs::path(*r.job.data.path) / "tokenizer.json";
  }
  std::error_code ec;
  if (fs::is_directory(file, ec)) {
    if (fs::is_regular_file(file / "tokenizer.json", ec)) {
      file /= "tokenizer.json";
    } else if (fs::is_regular_file(file / "vocab.json", ec) &&
               fs::is_regular_file(file / "merges.txt", ec)) {
      return Tokenizer::load_gpt2((file / "vocab.json").string(), (file / "merges.txt").string());
    } else {
      throw Error(fmt::format("{}: neither tokenizer.json nor vocab.json and merges.txt in it",
                              file.string()),
                  kHint);
    }
  }
  if (!fs::is_regular_file(file, ec))
    throw Error(fmt::format("{}: no such tokenizer file", file.string()), kHint);
  return Tokenizer::load(file.string());
}

// Ids a sample may draw: the tokenizer's ordinary tokens and <|endoftext|>.
std::vector<int32_t> candidate_ids(const Tokenizer& tok, int64_t model_vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(tok.first_special()));
  std::iota(ids.begin(), ids.end(), 0);
  ids.push_back(tok.special(Special::endoftext));
  std::sort(ids.begin(), ids.end());
  DTRAIN_CHECK(ids.back() < model_vocab, "token {} past the vocabulary {}", ids.back(),
               model_vocab);
  return ids;
}

// u in [0, 1) with 53 random bits, from words 2i and 2i + 1 of the stream.
double uniform53(const Philox& rng, uint64_t i) {
  const uint64_t hi = rng.u32(2 * i) >> 6, lo = rng.u32(2 * i + 1) >> 5;  // 26 + 27 bits
  return static_cast<double>((hi << 27) | lo) * 0x1p-53;
}

// The forward graph at one length, and the executor holding the weights.
struct Forward {
  int64_t length = 0;
  models::ModelGraph model;
  std::unique_ptr<graph::Executor> ex;
  Tensor ids_host, ids;
};

std::unique_ptr<Forward> make_forward(const Job& job, int64_t batch, int64_t length) {
  auto f = std::make_unique<Forward>();
  f->length = length;
  ModelOptions options = job.model;
  options.seq_len = static_cast<int>(length);
  f->model = models::build_model(options, batch);  // fp32: the default DTypePolicy
  f->ex =
      std::make_unique<graph::Executor>(f->model.graph, job.device, graph::GradBuffer::external);
  f->ex->keep(f->model.logits, graph::Mode::eval);
  // Up to the logits: the loss node (a softmax over every position) has nothing to do here.
  const int loss_node = f->model.graph.value(f->model.loss).producer;
  DTRAIN_CHECK(loss_node == static_cast<int>(f->model.graph.nodes().size()) - 1,
               "generate: the loss is node {} of {}, not the last", loss_node,
               f->model.graph.nodes().size());
  f->ex->set_range(0, loss_node);
  Allocator* alloc = &kernels::device_allocator(job.device);
  f->ids_host = Tensor::empty({batch, length}, DType::i32);
  f->ids = job.device.is_cpu() ? f->ids_host : Tensor::empty({batch, length}, DType::i32, alloc);
  return f;
}

void load_weights(Forward& f, const Tensor& weights) {
  Tensor live = f.ex->params().flat(DType::f32);
  DTRAIN_CHECK(live.defined() && live.numel() == weights.numel(),
               "generate: {} weights for a layout of {}", weights.numel(),
               live.defined() ? live.numel() : 0);
  kernels::copy(weights, live);
}

// The positions of the graph for a context of `positions` tokens: a power of two from
// kShortestForward on, at most the model's context.
int64_t forward_length(int64_t positions, int64_t context) {
  int64_t n = kShortestForward;
  while (n < positions) n *= 2;
  return std::min(n, context);
}

}  // namespace

TokenPick pick_token(std::span<const float> logits, std::span<const int32_t> candidates,
                     const SamplingOptions& o, double u) {
  DTRAIN_CHECK(!candidates.empty(), "pick_token: no candidates");
  double top = -std::numeric_limits<double>::infinity();
  for (float x : logits) {
    if (!std::isfinite(x)) {
      throw RunError("the model's logits are not finite (a checkpoint of a run that diverged?)",
                     "generate from an earlier checkpoint (--checkpoint)");
    }
    top = std::max(top, static_cast<double>(x));
  }
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
  const double log_z = top + std::log(sum);
  const auto pick = [&](int32_t id) {
    return TokenPick{id, static_cast<double>(logits[static_cast<size_t>(id)]) - log_z};
  };
  const auto logit = [&](int32_t id) { return logits[static_cast<size_t>(id)]; };
  // Most likely first; ties to the smaller id.
  const auto more_likely = [&](int32_t a, int32_t b) {
    return logit(a) != logit(b) ? logit(a) > logit(b) : a < b;
  };
  if (o.temperature == 0.0)
    return pick(*std::min_element(candidates.begin(), candidates.end(), more_likely));

  std::vector<int32_t> kept(candidates.begin(), candidates.end());
  const size_t k = o.top_k > 0 ? std::min(kept.size(), static_cast<size_t>(o.top_k)) : kept.size();
  if (k < kept.size() || o.top_p < 1.0) {
    std::partial_sort(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(k), kept.end(),
                      more_likely);
    kept.resize(k);
  }
  double best = -std::numeric_limits<double>::infinity();
  for (int32_t id : kept) best = std::max(best, static_cast<double>(logit(id)));
  std::vector<double> p(kept.size());
  double total = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    p[i] = std::exp((static_cast<double>(logit(kept[i])) - best) / o.temperature);
    total += p[i];
  }
  if (o.top_p < 1.0) {  // kept is in order, most likely first: cut after p is reached
    double mass = 0.0;
    size_t n = 0;
    while (n < kept.size() && (n == 0 || mass < o.top_p * total)) mass += p[n++];
    kept.resize(n);
    p.resize(n);
    total = mass;
  }
  // Draw in id order, so the same kept set gives the same token whatever order it came in.
  std::vector<size_t> by_id(kept.size());
  std::iota(by_id.begin(), by_id.end(), size_t{0});
  std::sort(by_id.begin(), by_id.end(), [&](size_t a, size_t b) { return kept[a] < kept[b]; });
  double acc = 0.0;
  const double target = u * total;
  for (size_t i : by_id) {
    acc += p[i];
    if (target < acc) return pick(kept[i]);
  }
  return pick(kept[by_id.back()]);  // u * total rounded up to the sum
}

namespace {

// The draws: the prompt through the graph (pinning each layer's q/k/v projection when a
// cache will follow), then cached steps while the context has room, then graph forwards
// over the sliding window. Out of memory surfaces as the allocator's Error.
void decode(const GenerateRequest& r, const models::TransformerShape& shape, const Tokenizer& tok,
            const Tensor& weights, GenerateResult& out) {
  const Job& job = r.job;
  const int64_t context = shape.seq_len, batch = r.samples;
  const std::vector<int32_t> candidates = candidate_ids(tok, shape.vocab);
  const int32_t end_id = tok.special(Special::endoftext);
  const int64_t prompt_len = static_cast<int64_t>(out.prompt_ids.size());
  // Each sample's history: the last `context` tokens are all the model sees, so no more
  // than twice that is kept (a long prompt is not copied per sample).
  const auto last = [&](const std::vector<int32_t>& v) {
    const size_t keep = std::min(v.size(), static_cast<size_t>(context));
    return std::vector<int32_t>(v.end() - static_cast<std::ptrdiff_t>(keep), v.end());
  };
  std::vector<std::vector<int32_t>> seq(static_cast<size_t>(batch), last(out.prompt_ids));
  const bool will_cache = r.cache && prompt_len < context && r.tokens > 1;

  const auto start = std::chrono::steady_clock::now();
  out.samples.resize(static_cast<size_t>(batch));
  std::vector<Philox> rng;
  for (int64_t b = 0; b < batch; ++b)
    rng.emplace_back(r.seed, rng_stream_id(kSamplingPurpose, 0, static_cast<uint64_t>(b)));
  std::unique_ptr<Forward> f;
  std::unique_ptr<KvDecoder> cached;
  std::vector<float> rows(static_cast<size_t>(batch * shape.vocab));  // this token's logits
  for (int64_t t = 0; t < r.tokens; ++t) {
    // Every sample has the same length: an ended one stops drawing, not running.
    const int64_t total = prompt_len + t;  // positions so far (seq holds their last ones)
    const int64_t window = std::min(total, context);
    if (cached && total <= context) {
      std::vector<int32_t> last_ids;
      for (const std::vector<int32_t>& h : seq) last_ids.push_back(h.back());
      const Tensor host = kernels::to_host(cached->step(last_ids));  // [batch, vocab]: one copy
      std::copy_n(host.data<float>(), rows.size(), rows.data());
      ++out.cached_steps;
    } else {
      cached.reset();
      // The prompt's forward before a cache runs at its exact length: no padding at all
      // (padding is invisible to causal attention only while its activations are finite).
      const bool fill = will_cache && t == 0;
      const int64_t length = fill ? window : forward_length(window, context);
      if (!f || length != f->length) {
        f.reset();  // one executor at a time
        f = make_forward(job, batch, length);
        load_weights(*f, weights);
      }
      std::vector<graph::ValueId> qkv;  // pinned for the cache to copy, when one follows
      if (fill) {
        qkv = KvDecoder::qkv_values(f->model.graph, shape.layers);
        for (graph::ValueId v : qkv) f->ex->keep(v, graph::Mode::eval);
      }
      int32_t* ids = f->ids_host.data<int32_t>();
      for (int64_t b = 0; b < batch; ++b) {
        const std::vector<int32_t>& s = seq[static_cast<size_t>(b)];
        std::copy(s.end() - window, s.end(), ids + b * length);
        std::fill(ids + b * length + window, ids + (b + 1) * length, end_id);  // never attended
      }
      if (!job.device.is_cpu()) kernels::copy(f->ids_host, f->ids);
      f->ex->set_input(f->model.input, f->ids);
      f->ex->forward(graph::Mode::eval);
      ++out.forwards;
      const Tensor& logits = f->ex->value(f->model.logits);  // [batch, length, vocab]
      for (int64_t b = 0; b < batch; ++b) {
        const Tensor row =
            kernels::to_host(logits.view((b * length + window - 1) * shape.vocab, {shape.vocab}));
        std::copy_n(row.data<float>(), shape.vocab, rows.data() + b * shape.vocab);
      }
      if (fill) {
        // Positions the cache will hold: up to the last token fed back (the last drawn
        // is never fed), within the context.
        const int64_t capacity = std::min(context, prompt_len + r.tokens - 1);
        cached = std::make_unique<KvDecoder>(shape, batch, capacity, f->ex->params());
        cached->fill(*f->ex, qkv, length, total);
        f.reset();  // the prompt's activations and logits; the weights stay with the cache
      }
    }
    bool all_ended = true;
    for (int64_t b = 0; b < batch; ++b) {
      GeneratedSample& s = out.samples[static_cast<size_t>(b)];
      std::vector<int32_t>& history = seq[static_cast<size_t>(b)];
      if (s.ended) {
        history.push_back(end_id);  // never read: it keeps every sample the same length
        continue;
      }
      const TokenPick p = pick_token(
          std::span<const float>(rows.data() + b * shape.vocab, static_cast<size_t>(shape.vocab)),
          candidates, r.sampling, uniform53(rng[static_cast<size_t>(b)], static_cast<uint64_t>(t)));
      s.ids.push_back(p.id);
      s.logprobs.push_back(p.logprob);
      history.push_back(p.id);
      s.ended = r.stop_at_end && p.id == end_id;
      all_ended = all_ended && s.ended;
    }
    for (std::vector<int32_t>& history : seq)
      if (history.size() >= static_cast<size_t>(2 * context)) history = last(history);
    if (all_ended) break;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GenerateResult generate(const GenerateRequest& r) {
  const Job& job = r.job;
  const ArchPreset* arch = find_arch(job.model.arch);
  if (arch == nullptr || arch->family != ModelFamily::gpt) {
    throw Error(fmt::format("model.arch {}: dtrain generate continues text with a GPT-2 model "
                            "(gpt2, gpt2-tiny, ...)",
                            job.model.arch),
                "a BERT predicts masked tokens and an image model classes; neither writes text");
  }
  if (r.samples < 1 || r.tokens < 1)
    throw Error(
        fmt::format("--samples {} and --tokens {} must be at least 1", r.samples, r.tokens));
  const models::TransformerShape shape = models::resolve_transformer(job.model, ModelFamily::gpt);
  const Tokenizer tok = read_tokenizer(r);
  // What a sample can draw must be a row of the model: the tokenizer's ordinary tokens
  // and <|endoftext|> (Hugging Face's GPT-2 has 50257 rows, and dtrain appends its five
  // other specials after them).
  const int64_t needed =
      std::max<int64_t>(tok.first_special(), tok.special(Special::endoftext) + 1);
  if (needed > shape.vocab) {
    throw Error(fmt::format("the tokenizer's tokens need {} rows, more than the model's "
                            "vocabulary ({})",
                            needed, shape.vocab),
                "use the tokenizer of the model's training data (data.path or --tokenizer)");
  }
  const int64_t context = shape.seq_len;
  const int32_t end_id = tok.special(Special::endoftext);

  GenerateResult out;
  out.context = context;
  out.prompt_ids.push_back(end_id);  // documents in the token shards start after one
  tok.encode_append(r.prompt, out.prompt_ids);
  // Cut when the user's tokens do not all fit (the leading <|endoftext|> may go alone).
  out.prompt_cut = static_cast<int64_t>(out.prompt_ids.size()) - 1 > context;
  const Weights w = [&] {
    ModelOptions options = job.model;  // the layout alone: no executor, nothing allocated
    options.seq_len = static_cast<int>(std::min<int64_t>(context, kShortestForward));
    return read_weights(r, models::build_model(options, 1).graph, shape.heads);
  }();
  out.weights = w.source;
  out.step = w.step;
  if (r.on_start) r.on_start(out);
  try {
    decode(r, shape, tok, w.params, out);
  } catch (const Error& e) {
    const std::string m = e.message();
    if (m.rfind("out of host memory", 0) != 0 && m.rfind("out of memory on", 0) != 0) throw;
    throw RunError(m, fmt::format("generate fewer samples at once (--samples {}): each forward "
                                  "holds every sample's logits over the context, and the "
                                  "key/value cache each sample's keys and values per layer "
                                  "(--no-cache holds none)",
                                  r.samples));
  }
  for (GeneratedSample& s : out.samples) {
    std::vector<int32_t> text = s.ids;
    if (s.ended) text.pop_back();
    s.text = tok.decode(text);
  }
  return out;
}

}  // namespace dtrain::runtime
