// `dtrain predict`: what a trained model says about texts. A BERT classifier
// (model.num_classes) gives each text its class and every class's probability; a
// masked-LM BERT fills each [MASK] of a text with its most likely tokens (Hugging Face's
// fill-mask); a GPT-2 scores each text: every token's log-probability given the ones
// before it, and the text's perplexity. The weights
// come as for `dtrain generate` (runtime/inference.h): the job's newest checkpoint
// of any layout, --checkpoint, or a safetensors file; the forward is the training graph
// in fp32 and evaluation mode (no dropout), on the job's device.
//
// A classifier's text becomes the row its training data made: [CLS], the text's first
// seq_len - 2 tokens, [SEP], then [PAD]s that attention ignores; rows run at the
// model's seq_len, as the trainer's evaluation runs them. A fill-mask text becomes
// <|endoftext|>, its tokens with one [MASK] per "[MASK]" in the text, then <|endoftext|>
// (a document as the token shards hold it), and runs at its own length: a masked-LM
// BERT trained on windows of text has no padding mask, so texts of one length share a
// forward and no text sees padding.
//
// A GPT-2 text becomes <|endoftext|> then its tokens (a document as the token shards hold
// it), and every token after the first is scored. A text of up to seq_len tokens is one
// forward: each token sees every token before it, as in the trainer's evaluation. A
// longer one runs in windows of seq_len tokens that advance by seq_len / 2 (Hugging
// Face's strided perplexity, with the window's last position used too: it predicts the
// token after the window); each window scores the tokens the one before did not reach,
// so every token is scored once, with at least seq_len / 2 tokens before it.
// Windows run at a power-of-two length (16 up to seq_len) with <|endoftext|> after the
// text: causal attention never lets an earlier position see it (while its activations
// are finite, as a trained model's are). A GPT-2's <|endoftext|> is the tokenizer's,
// whatever the data (Hugging Face's GPT-2 files run as a synthetic-data job).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/job.h"

namespace dtrain::runtime {

struct PredictRequest {
  Job job;
  std::string weights;                 // as GenerateRequest::weights
  std::string which_weights = "auto";  // as GenerateRequest::which_weights
  std::string tokenizer;               // tokenizer.json or a directory; empty: data.path's
  std::vector<std::string> texts;
  std::vector<std::string> where;  // per text, for messages ("rows.tsv:7"); empty: "text N"
  // Rows per forward at most: texts (GPT-2: windows); 0: 32, and for a GPT-2 as many as
  // keep one forward's logits (rows x length x vocab floats) within 1 GiB, at least 1.
  int64_t batch = 0;
  int64_t top = 0;  // fill-mask: tokens listed per [MASK] (0: 5); no other task lists any
};

struct TokenScore {
  int32_t id = -1;
  std::string token;  // its bytes
  double probability = 0.0;
};

struct TextPrediction {
  int64_t tokens = 0;  // the text's own tokens (without [CLS] / [SEP] / <|endoftext|>)
  // What the model read: [CLS] ... [SEP] (its [PAD]s not shown), or <|endoftext|> ...
  // <|endoftext|> with the [MASK]s' ids
  std::vector<int32_t> ids;
  // classify: the most likely class (ties to the smaller id), every class's probability,
  // and whether the text was cut to seq_len - 2 tokens
  int32_t label = -1;
  std::vector<double> probabilities;
  bool cut = false;
  // fill-mask: per [MASK] in text order, its most likely ordinary tokens (probabilities
  // over the whole vocabulary, as the model gives them), and the text with the first
  // of each filled in
  std::vector<std::vector<TokenScore>> masks;
  std::string filled;
  // score: each scored token's log-probability (natural log, under the model: the whole
  // vocabulary), in text order: ids[1..] (ids holds <|endoftext|> and the text's tokens)
  std::vector<double> logprobs;
  int64_t windows = 0;  // forwards over this text's windows
};

enum class PredictTask : uint8_t { classify, fill_mask, score };

struct PredictResult {
  PredictTask task = PredictTask::classify;
  std::string weights;
  bool ema = false;  // the weights are optimizer.ema's average
  int64_t step = -1;
  std::vector<std::string> classes;  // classify: data.path's labels.json, else "0", "1", ...
  std::string classes_file;          // the labels.json read; empty: none found
  int32_t mask_id = -1;              // fill-mask: the tokenizer's [MASK]
  std::vector<TextPrediction> texts;
  int64_t forwards = 0;
  int64_t rows_per_forward = 0;  // texts (GPT-2: windows) per forward at most
  double seconds = 0.0;          // the forwards' wall time (weights and tokenizer excluded)
};

PredictResult predict(const PredictRequest& r);

// An Error unless the job's model is a BERT (what predict reads), saying what reads the
// others.
void check_predict_model(const Job& job);

// The names of the job's classes: the labels.json that `dtrain data tokenize --labelled`
// writes beside the tokenizer, in data.path or else beside `tokenizer` (--tokenizer: a
// file or a directory); its count must be model.num_classes. Neither: "0" ... "K-1".
// `file`, when given, is set to the labels.json read (empty: none).
std::vector<std::string> class_names(const Job& job, const std::string& tokenizer,
                                     std::string* file = nullptr);

// ---- Image models (ResNet, ViT): classes of image files, or of the job's test split ----
//
// A file (data/image_file.h: PNG, JPEG, PGM, PPM) becomes the model's channels and size
// (the shorter side scaled to it, the middle cut out), then is normalised with the
// dataset's statistics, as the trainer's evaluation feeds its test split; the test split
// (data.limit.test applies) comes through that very feed. Batch norm runs on its running
// statistics (evaluation mode).
struct ImagePredictRequest {
  Job job;
  std::string weights;                 // as GenerateRequest::weights
  std::string which_weights = "auto";  // as GenerateRequest::which_weights
  std::vector<std::string> files;      // image files
  bool test_split = false;             // the job's test split instead of files
  int64_t batch = 0;                   // images per forward; 0: data.micro_batch
};

struct ImagePrediction {
  std::string where;   // the file, or "test N" (0-based)
  int32_t label = -1;  // the most likely class, ties to the smaller id
  std::vector<double> probabilities;
  int32_t truth = -1;                       // the test split's label; -1 for a file
  int width = 0, height = 0, channels = 0;  // a file's own
  std::string format;                       // a file's: "png", "jpeg", "pgm", "ppm"
  // A file that could not be read: why (label -1, no probabilities); the others are
  // classified all the same.
  std::string error;
};

struct ImagePredictResult {
  std::string weights;
  bool ema = false;  // the weights are optimizer.ema's average
  int64_t step = -1;
  std::vector<std::string> classes;
  std::string classes_source;  // "Fashion-MNIST", a batches.meta.txt, ...; empty: numbers
  int channels = 0, size = 0;  // the model's input
  std::vector<ImagePrediction> images;
  int64_t forwards = 0;
  int64_t rows_per_forward = 0;
  double seconds = 0.0;  // the forwards' wall time
  // The test split: the mean cross-entropy of the true classes (the evaluation's
  // test_loss) and the share predicted right (its test_accuracy).
  double loss = 0.0, accuracy = 0.0;
};

bool is_image_model(const Job& job);
ImagePredictResult predict_images(const ImagePredictRequest& r);
// The dataset's class names: `trained` (the names the weights' run recorded: an image
// folder's class directories) when given, Fashion-MNIST's and CIFAR-10's own, CIFAR-10's
// batches.meta.txt or CIFAR-100's fine_label_names.txt in data.path when there, MNIST's
// digits; otherwise (synthetic data, another count) "0" ... "K-1".
std::vector<std::string> image_class_names(const Job& job,
                                           const std::vector<std::string>& trained = {},
                                           std::string* source = nullptr);

}  // namespace dtrain::runtime
