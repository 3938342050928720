// What the inference commands (`dtrain generate`, `dtrain predict`) share: the model's
// weights, from one of its checkpoints (any layout: a file, a ZeRO / pipeline /
// tensor-parallel directory) or a safetensors file under the reference names (`dtrain ckpt
// export`, Hugging Face's own files); the tokenizer of its training text; and the training
// graph run forward only, in fp32 and evaluation mode, holding those weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "data/tokenizer.h"
#include "graph/executor.h"
#include "graph/graph.h"
#include "models/model.h"
#include "runtime/job.h"

namespace dtrain::runtime {

// The model's weights as one f32 buffer in the graph's parameter layout (an fp32
// graph's layout: every entry f32).
struct ModelWeights {
  Tensor params;
  // The graph's f32 buffers (batch norm's running statistics), in its buffer layout;
  // undefined for a model without any.
  Tensor buffers;
  std::string source;                // what was read (a path)
  int64_t step = -1;                 // the checkpoint's step; -1: a safetensors file
  bool ema = false;                  // optimizer.ema's average (a checkpoint's, or an export of it)
  std::vector<std::string> classes;  // the names it was trained with (an image folder's)
};

// `weights`: a checkpoint (a step file or step-N/ directory), a run or checkpoints
// directory (its newest), or a safetensors file (known by its bytes too); empty or
// "latest": the job's newest checkpoint, else model.init_from. `g` gives the layout
// (any sequence length and batch: the parameters do not depend on them), `heads` the
// job's attention heads (0: no heads to check), `command` the subcommand for messages.
// Every tensor of the model must come from the file: a safetensors file without the
// model's task head is an Error. Errors say what to pass instead.
// `which`: of a checkpoint, its weights or optimizer.ema's average (runtime/safetensors.h's
// select_weights: auto, model or ema); a safetensors file holds one set, which dtrain's
// export names in its metadata ("weights": ema or model, else model): asking for the
// other is an Error.
ModelWeights read_model_weights(const Job& job, const std::string& weights, const graph::Graph& g,
                                int64_t heads, std::string_view command,
                                std::string_view which = "auto");

// `tokenizer`: a tokenizer.json, or a directory holding one or GPT-2's vocab.json and
// merges.txt; empty: data.path's tokenizer.json (data.dataset tokens).
Tokenizer read_model_tokenizer(const Job& job, const std::string& tokenizer,
                               std::string_view command);

// A safetensors file by its name, or by its first bytes: a u64 header length, then the
// header's '{' (a dtrain checkpoint starts with "DTRAINCK").
bool is_safetensors(const std::filesystem::path& path);

// The model of `options` at batch x options.seq_len, fp32 (the default DTypePolicy), up to
// its logits: the loss node (the graph's last) is not run. Dropout is off (Mode::eval).
// The positions of a graph for `positions` tokens: a power of two from kShortestForward
// on, at most the model's context (a few graph shapes serve every length; causal
// attention keeps the padding after the tokens from the positions before it).
inline constexpr int64_t kShortestForward = 16;
int64_t padded_length(int64_t positions, int64_t context);

// One row of logits' softmax terms in double: its largest logit and the sum of
// exp(logit - top), so that p(i) = exp(logit_i - top) / sum and log p(i) = logit_i - top
// - log(sum). A non-finite logit (the weights of a run that diverged) is a RunError
// with `hint` (what to pass instead).
struct SoftmaxRow {
  double top = 0, sum = 0;
};
SoftmaxRow softmax_row(std::span<const float> logits, std::string_view hint);

struct InferenceGraph {
  int64_t batch = 0, length = 0;
  models::ModelGraph model;
  std::unique_ptr<graph::Executor> ex;
  // The model's input: token ids, i32 [batch, length], or images, f32 [batch, C, H, W];
  // on the host, and on the device.
  Tensor input_host, input;
  // The labels input, i32 [batch, length], when asked for (a masked-LM BERT: its head
  // reads the positions whose label is not kIgnoreLabel); else undefined.
  Tensor labels_host, labels;
  bool copy_inputs = false;  // a device job: the host tensors are copied before a forward

  // input_host (and labels_host) to the device, then the forward; returns the logits.
  const Tensor& forward();
};
std::unique_ptr<InferenceGraph> make_inference_graph(const Job& job, const ModelOptions& options,
                                                     int64_t batch, const Tensor& weights,
                                                     bool labels = false,
                                                     const Tensor& buffers = {});

}  // namespace dtrain::runtime
