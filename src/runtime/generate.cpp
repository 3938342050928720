// `dtrain generate` (runtime/generate.h): weights into a forward-only GPT-2 graph, the
// prompt through it, then one draw per new token (cached steps, or graph forwards).
#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "graph/executor.h"
#include "kernels/memory.h"
#include "models/registry.h"
#include "models/transformer.h"
#include "runtime/decoder.h"
#include "runtime/inference.h"

namespace dtrain::runtime {

namespace {

constexpr uint32_t kSamplingPurpose = 0x20;  // Philox stream: (seed, sample); word: 2 x token index

// u in [0, 1) with 53 random bits, from words 2i and 2i + 1 of the stream.
double uniform53(const Philox& rng, uint64_t i) {
  const uint64_t hi = rng.u32(2 * i) >> 6, lo = rng.u32(2 * i + 1) >> 5;  // 26 + 27 bits
  return static_cast<double>((hi << 27) | lo) * 0x1p-53;
}

}  // namespace

std::vector<int32_t> candidate_ids(const Tokenizer& tok, int64_t model_vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(tok.first_special()));
  std::iota(ids.begin(), ids.end(), 0);
  ids.push_back(tok.special(Special::endoftext));
  std::sort(ids.begin(), ids.end());
  DTRAIN_CHECK(ids.back() < model_vocab, "token {} past the vocabulary {}", ids.back(),
               model_vocab);
  return ids;
}

double sampling_uniform(uint64_t seed, uint64_t sample, uint64_t index) {
  return uniform53(Philox(seed, rng_stream_id(kSamplingPurpose, 0, sample)), index);
}

TokenPick pick_token(std::span<const float> logits, std::span<const int32_t> candidates,
                     const SamplingOptions& o, double u) {
  DTRAIN_CHECK(!candidates.empty(), "pick_token: no candidates");
  const SoftmaxRow row = softmax_row(logits, "generate from an earlier checkpoint (--checkpoint)");
  const double log_z = row.top + std::log(row.sum);
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
  std::unique_ptr<InferenceGraph> f;
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
      const int64_t length = fill ? window : padded_length(window, context);
      if (!f || length != f->length) {
        f.reset();  // one executor at a time
        ModelOptions options = job.model;
        options.seq_len = static_cast<int>(length);
        f = make_inference_graph(job, options, batch, weights);
      }
      std::vector<graph::ValueId> qkv;  // pinned for the cache to copy, when one follows
      if (fill) {
        qkv = KvDecoder::qkv_values(f->model.graph, shape.layers);
        for (graph::ValueId v : qkv) f->ex->keep(v, graph::Mode::eval);
      }
      int32_t* ids = f->input_host.data<int32_t>();
      for (int64_t b = 0; b < batch; ++b) {
        const std::vector<int32_t>& s = seq[static_cast<size_t>(b)];
        std::copy(s.end() - window, s.end(), ids + b * length);
        std::fill(ids + b * length + window, ids + (b + 1) * length, end_id);  // never attended
      }
      const Tensor& logits = f->forward();  // [batch, length, vocab]
      ++out.forwards;
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
  const Tokenizer tok = read_model_tokenizer(r.job, r.tokenizer, "generate");
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
  const ModelWeights w = [&] {
    ModelOptions options = job.model;  // the layout alone: no executor, nothing allocated
    options.seq_len = static_cast<int>(std::min<int64_t>(context, kShortestForward));
    return read_model_weights(job, r.weights, models::build_model(options, 1).graph, shape.heads,
                              "generate", r.which_weights);
  }();
  out.weights = w.source;
  out.ema = w.ema;
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
