// TrainSession's samples (logging.samples): text from the GPT-2 as it trains. Every
// `every` steps each rank runs the same forwards of the training graph itself, in
// evaluation mode (no dropout; ZeRO-3 gathers as the evaluation does), one new token per
// forward: rows [0, count) hold <|endoftext|>, the prompt and the tokens drawn so far,
// then <|endoftext|>s that causal attention keeps from the positions before them. Tokens
// are drawn as `dtrain generate` draws them (pick_token, sampling_uniform) under the
// seed run.seed + step, which the samples file records: `dtrain generate --checkpoint
// <that step's checkpoint> --seed <seed>` with the same sampling draws the same text
// (an fp32 run's; a bf16 graph's logits differ in their last bits). With optimizer.ema
// the samples are of the average, as the evaluations and generate's default are. No memory beyond
// the evaluation's: the same executor and shapes, and one row of logits on the host at a time.
#include <fstream>
#include <string>
#include <vector>

#include "models/transformer.h"
#include "runtime/generate.h"
#include "runtime/inference.h"
#include "runtime/train_session.h"

namespace dtrain::runtime {

namespace {

// <|endoftext|> and the prompt's tokens, refused where they and the new tokens pass the
// context.
std::vector<int32_t> samples_prompt(const Job& job, const Tokenizer& tok) {
  const SampleOptions& o = job.logging.samples;
  const models::TransformerShape shape = models::resolve_transformer(job.model, ModelFamily::gpt);
  std::vector<int32_t> prompt = {tok.special(Special::endoftext)};
  tok.encode_append(o.prompt.value_or(""), prompt);
  const auto room = static_cast<int64_t>(prompt.size()) + o.tokens;
  if (room > shape.seq_len) {
    throw Error(
        fmt::format("logging.samples: <|endoftext|>, the prompt's {} tokens and {} new "
                    "ones pass the context of {} (model.seq_len)",
                    prompt.size() - 1, o.tokens, shape.seq_len),
        fmt::format("shorten logging.samples.prompt, or set logging.samples.tokens: {}",
                    std::max<int64_t>(1, shape.seq_len - static_cast<int64_t>(prompt.size()))));
  }
  return prompt;
}

}  // namespace

void check_samples_prompt(const Job& job) {
  if (job.logging.samples.every == 0) return;
  samples_prompt(job, read_model_tokenizer(job, "", "logging.samples"));
}

void TrainSession::prepare_samples() {
  if (job_.logging.samples.every == 0) return;
  auto s = std::make_unique<TrainSamples>(
      TrainSamples{read_model_tokenizer(job_, "", "logging.samples"), {}, {}});
  const models::TransformerShape shape = models::resolve_transformer(job_.model, ModelFamily::gpt);
  s->candidates = candidate_ids(s->tok, shape.vocab);
  s->prompt = samples_prompt(job_, s->tok);
  samples_ = std::move(s);
}

// samples.jsonl as metrics.jsonl is kept: a fresh run (keep_through -1) starts it anew;
// a resumed one keeps the lines up to its checkpoint's step (the later ones, and a torn
// last line, belong to the run that stopped); either with samples off too, so that the
// file never holds another run's lines.
void TrainSession::trim_samples(int64_t keep_through) const {
  keep_jsonl_through(out_dir_ / "samples.jsonl", keep_through);
}

// With optimizer.ema, of the average, as the evaluations (and `dtrain generate`'s
// default) are: exchanged in for the samples and back on every rank.
void TrainSession::log_samples() {
  with_average([this](bool average) { draw_samples(average); });
}

void TrainSession::draw_samples(bool average) {
  const SampleOptions& o = job_.logging.samples;
  const int64_t rows = job_.data.micro_batch, length = *job_.model.seq_len;
  const TokenId end_id = samples_->tok.special(Special::endoftext);
  const uint64_t seed = counters_.seed + static_cast<uint64_t>(counters_.step);
  const SamplingOptions sampling{o.temperature, o.top_k, 1.0};
  std::vector<std::vector<int32_t>> seq(static_cast<size_t>(o.count), samples_->prompt);
  std::vector<bool> ended(static_cast<size_t>(o.count), false);
  bool failed = false;
  Tensor ids = Tensor::empty({rows, length}, DType::i32);
  Tensor labels = Tensor::empty({rows, length}, DType::i32);
  std::fill_n(labels.data<int32_t>(), labels.numel(), 0);  // counted by the loss, never read
  Allocator* alloc = &kernels::device_allocator(job_.device);
  const auto on_device = [&](const Tensor& host) {
    if (job_.device.is_cpu()) return host;
    Tensor t = Tensor::empty(host.shape(), host.dtype(), alloc);
    kernels::copy(host, t);
    return t;
  };
  FeedBatch batch;
  batch.labels = on_device(labels);
  const auto prompt = static_cast<int64_t>(samples_->prompt.size());
  for (int64_t t = 0; t < o.tokens; ++t) {
    const int64_t used = prompt + t;  // every row as long: an ended one keeps <|endoftext|>
    int32_t* in = ids.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int32_t>& s = seq[static_cast<size_t>(std::min(r, o.count - 1))];
      std::copy(s.begin(), s.end(), in + r * length);
      std::fill(in + r * length + used, in + (r + 1) * length, end_id);
    }
    batch.input = on_device(ids);
    set_batch(batch);
    ex_->forward(graph::Mode::eval, static_cast<uint64_t>(counters_.step));
    if (zero_params_) zero_params_->end_pass();
    const Tensor& logits = ex_->value(model_.logits);
    const int64_t vocab = logits.numel() / (rows * length);
    bool all_ended = true;
    for (int64_t b = 0; b < o.count; ++b) {
      std::vector<int32_t>& s = seq[static_cast<size_t>(b)];
      if (ended[static_cast<size_t>(b)]) {
        s.push_back(end_id);
        continue;
      }
      const Tensor row = host_f32(logits.view((b * length + used - 1) * vocab, {vocab}));
      TokenPick p;
      try {
        p = pick_token(std::span<const float>(row.data<float>(), static_cast<size_t>(vocab)),
                       samples_->candidates, sampling,
                       sampling_uniform(seed, static_cast<uint64_t>(b), static_cast<uint64_t>(t)));
      } catch (const RunError&) {  // non-finite logits: the step's own checks say more
        failed = true;
        break;
      }
      s.push_back(p.id);
      ended[static_cast<size_t>(b)] = p.id == end_id;
      all_ended = all_ended && p.id == end_id;
    }
    // Every rank runs as many forwards (ZeRO-3's gathers are collective): they stop
    // together, when any has nothing left to draw.
    const double done = all_ended || failed ? 1.0 : 0.0;
    if ((comm_.size() > 1 ? sum_over_ranks<1>(comm_, {done})[0] : done) > 0) break;
  }
  if (failed) {
    note(fmt::format("note: no samples at step {}: the model's logits are not finite",
                     counters_.step));
    return;
  }
  if (!leader()) return;
  std::ofstream out(out_dir_ / "samples.jsonl", std::ios::app);
  for (int64_t b = 0; b < o.count; ++b) {
    const std::vector<int32_t>& s = seq[static_cast<size_t>(b)];
    std::vector<int32_t> fresh(s.begin() + prompt, s.end());
    while (!fresh.empty() && fresh.back() == end_id) fresh.pop_back();  // an ended sample's
    const std::string text = samples_->tok.decode(fresh);
    const nlohmann::json line = {{"step", counters_.step},
                                 {"sample", b},
                                 {"seed", seed},
                                 {"prompt", o.prompt.value_or("")},
                                 {"text", text},
                                 {"ids", fresh},
                                 {"ended", ended[static_cast<size_t>(b)]},
                                 {"weights", average ? "ema" : "model"}};
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    note(fmt::format("sample {} at step {}{}: {}", b, counters_.step,
                     average ? " (EMA weights)" : "",
                     nlohmann::json(o.prompt.value_or("") + text)
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
}

}  // namespace dtrain::runtime
