// `dtrain generate`: text from a trained GPT-2. The job file says the model and where
// its tokenizer is; the weights come from one of its checkpoints (any layout: a file,
// a ZeRO / pipeline / tensor-parallel directory) or a safetensors file under Hugging
// Face's GPT2LMHeadModel names (`dtrain ckpt export`, or Hugging Face's own GPT-2).
// The prompt runs through the training graph, in fp32 and evaluation mode (no dropout),
// on the job's device; each new token is then one position through a key/value cache
// (runtime/decoder.h) while the context has room. Past model.seq_len the window slides:
// every token runs the graph over the last seq_len tokens (positions from 0). The
// prompt's forward runs at its exact length; with the cache off, a forward over a
// shorter context runs at a length rounded up to a power of two, and causal attention
// makes the padding after the context invisible (while its activations are finite). Sampling draws
// from Philox keyed by (seed, sample, token index), so a sample does not depend on how many others
// run beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "runtime/job.h"

namespace dtrain::runtime {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the most likely token, ties to the smaller id)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // then the smallest most-likely set whose probability reaches p
};

struct TokenPick {
  int32_t id = -1;
  double logprob = 0.0;  // log p(id) under the model: temperature 1, every token of the vocabulary
};

// One token from one position's logits (f32 [V]). Only `candidates` can be drawn (ids
// the tokenizer can decode: its ordinary tokens and <|endoftext|>, never padding rows
// of the vocabulary or [MASK]); `u` in [0, 1) picks among them.
TokenPick pick_token(std::span<const float> logits, std::span<const int32_t> candidates,
                     const SamplingOptions& o, double u);
// The ids a sample may draw: the tokenizer's ordinary tokens and <|endoftext|>, ascending.
std::vector<int32_t> candidate_ids(const Tokenizer& tok, int64_t model_vocab);
// The u that token `index` of sample `sample` draws with under `seed`, in [0, 1): Philox
// keyed by (seed, sample), so `dtrain generate --seed S` and the trainer's samples
// (logging.samples) draw alike.
double sampling_uniform(uint64_t seed, uint64_t sample, uint64_t index);

struct GenerateResult;

struct GenerateRequest {
  Job job;
  std::string weights;  // a checkpoint, a run or checkpoint directory, a .safetensors
                        // file; empty: the job's newest checkpoint, else model.init_from
  // A checkpoint's weights or optimizer.ema's average: auto (the average when it holds
  // one), model or ema (runtime/inference.h).
  std::string which_weights = "auto";
  std::string tokenizer;  // tokenizer.json; empty: data.path's
  std::string prompt;     // text; generation starts with <|endoftext|> then these tokens
  int64_t tokens = 64;    // new tokens per sample at most
  int samples = 1;
  SamplingOptions sampling;
  uint64_t seed = 0;
  bool stop_at_end = true;  // a sample ends at <|endoftext|> (the end of a document)
  // Continue the prompt's forward with a key/value cache (runtime/decoder.h) while the
  // context has room; false: run the graph over the whole context for every token.
  bool cache = true;
  // Called once the weights are loaded, before the first forward (weights, step,
  // prompt_ids, context and prompt_cut are set), for a console line.
  std::function<void(const GenerateResult&)> on_start;
};

struct GeneratedSample {
  std::vector<int32_t> ids;  // the new tokens, <|endoftext|> included when it ended there
  std::vector<double> logprobs;
  std::string text;  // the new tokens decoded (without a final <|endoftext|>)
  bool ended = false;
};

struct GenerateResult {
  std::string weights;  // what was read
  bool ema = false;     // the weights are optimizer.ema's average
  int64_t step = -1;    // the checkpoint's step (-1: a safetensors file)
  std::vector<int32_t> prompt_ids;
  int64_t context = 0;      // the most positions the model sees: model.seq_len
  bool prompt_cut = false;  // the prompt was longer than the context: its start was dropped
  std::vector<GeneratedSample> samples;
  int64_t forwards = 0;      // graph forwards over the context
  int64_t cached_steps = 0;  // one-position steps with the key/value cache
  double seconds = 0.0;      // the forwards' and draws' wall time (weights and tokenizer excluded)
};

GenerateResult generate(const GenerateRequest& r);

}  // namespace dtrain::runtime
