// BERT, ViT and GPT-2 builders: exact parameter counts against the published
// models, shape errors naming the keys, summaries, finite-difference gradient
// checks of whole tiny models (tied embeddings included), and a tiny GPT-2
// memorising a fixed token sequence with AdamW.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "graph/executor.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "models/registry.h"
#include "models/vit.h"
#include "optim/optimizer.h"

using namespace dtrain;
using namespace dtrain::models;

namespace {

ModelOptions preset(const char* arch) { return preset_options(*find_arch(arch)); }

// 2 layers, hidden 16, 2 heads, ffn 32, dropout 0; LMs: vocab 50, 8 tokens, 12 positions;
// BERT's head predicts 4 positions per sequence (feed_lm labels 3: one padding row).
ModelOptions tiny(const char* arch) {
  ModelOptions o = preset(arch);
  o.layers = 2;
  o.hidden = 16;
  o.heads = 2;
  o.ffn = 32;
  o.dropout = 0.0;
  if (o.vocab_size) {
    o.vocab_size = 50;
    o.seq_len = 8;
    o.max_positions = 12;
    o.mlm_predictions = 4;
  } else {
    o.image_size = 8;
    o.patch_size = 4;
    o.in_channels = 2;
    o.num_classes = 5;
  }
  return o;
}

Tensor ids(const Shape& s, int vocab, int mul, int add) {
  Tensor t = Tensor::empty(s, DType::i32);
  for (int64_t i = 0; i < s.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>((mul * i + add) % vocab);
  return t;
}

void feed_lm(graph::Executor& ex, const ModelGraph& m, int vocab, bool masked) {
  const Shape& s = m.graph.value(m.input).spec.shape;
  ex.set_input(m.input, ids(s, vocab, 7, 3));
  Tensor labels = ids(s, vocab, 11, 5);
  if (masked) {  // BERT: only every third position is a masked (labelled) token
    for (int64_t i = 0; i < labels.numel(); ++i)
      if (i % 3 != 0) labels.data<int32_t>()[i] = -100;
  }
  ex.set_input(m.labels, labels);
}

void feed_images(graph::Executor& ex, const ModelGraph& m, int classes) {
  const Shape& s = m.graph.value(m.input).spec.shape;
  Tensor x = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.37f * i) + 0.1f;
  ex.set_input(m.input, x);
  ex.set_input(m.labels, ids({s[0]}, classes, 3, 1));
}

float loss_of(graph::Executor& ex, const ModelGraph& m) {
  ex.forward(graph::Mode::train);
  return ex.value(m.loss).data<float>()[0];
}

struct Entry {
  std::string param;
  int64_t index;
};

// Central differences of the executor's own f32 loss, in double:
//   fd = (L(w + h) - L(w - h)) / (w+ - w-), with w+- the f32-rounded perturbed values.
// Step h = 3e-3: the f32 loss (~4) carries ~1e-7 of rounding noise per evaluation,
// which the division turns into ~5e-5; the truncation error h^2/6 * L''' is ~1e-3
// relative at most here (at h = 1e-2 it reached 2% on ViT's class token, whose
// gradient is ~0.4). Tolerance 2e-4 + 1e-2 |fd|: the worst entry observed uses 22%
// of it. Dropping one user's share of a tied gradient (an input token's word
// embedding row: embedding + decoder) is off by ~0.05 and fails.
void check_entries(graph::Executor& ex, const ModelGraph& m, const std::vector<Entry>& entries) {
  ex.forward(graph::Mode::train);
  ex.backward(m.loss);
  for (const Entry& e : entries) {
    const float g = ex.grads().view(e.param).data<float>()[e.index];
    float* w = ex.params().view(e.param).data<float>() + e.index;
    const float w0 = *w;
    const double h = 3e-3;
    *w = static_cast<float>(w0 + h);
    const double plus_w = *w, plus = loss_of(ex, m);
    *w = static_cast<float>(w0 - h);
    const double minus_w = *w, minus = loss_of(ex, m);
    *w = w0;
    const double fd = (plus - minus) / (plus_w - minus_w);
    INFO(e.param, "[", e.index, "]: backward ", g, ", finite difference ", fd);
    CHECK(std::abs(g - fd) <= 2e-4 + 1e-2 * std::abs(fd));
  }
}

// The entry of `param` with the largest |gradient| among its first `rows` rows (a
// clear signal for the finite difference), after one forward + backward.
Entry largest(graph::Executor& ex, const ModelGraph& m, const std::string& param,
              int64_t rows = -1) {
  ex.forward(graph::Mode::train);
  ex.backward(m.loss);
  const Tensor g = ex.grads().view(param);
  const int64_t n = rows < 0 ? g.numel() : rows * g.dim(-1);
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (std::abs(g.data<float>()[i]) > std::abs(g.data<float>()[best])) best = i;
  return {param, best};
}

// Two entries of every parameter tensor: its largest gradient and one fixed other entry.
std::vector<Entry> every_param(graph::Executor& ex, const ModelGraph& m) {
  std::vector<Entry> out;
  for (const graph::FlatEntry& e : ex.params().entries()) {
    out.push_back(largest(ex, m, e.name));
    out.push_back({e.name, (e.spec.shape.numel() * 3) / 7});
  }
  return out;
}

double grad_at(graph::Executor& ex, const std::string& param, int64_t index) {
  return ex.grads().view(param).data<float>()[index];
}

}  // namespace

TEST_CASE("parameter counts match the published BERT-base, ViT-B/16 and GPT-2 small") {
  const ModelOptions bert = preset("bert-base");
  // BertModel (with pooler), BertForMaskedLM (no pooler, decoder tied + bias [V]),
  // BertForSequenceClassification with 2 labels, as Hugging Face counts them.
  CHECK(build_bert(bert, 1, BertHead::pooler).graph.num_params() == 109'482'240);
  CHECK(build_bert(bert, 1, BertHead::masked_lm).graph.num_params() == 109'514'298);
  ModelOptions cls = bert;
  cls.num_classes = 2;
  CHECK(build_bert(cls, 1).graph.num_params() == 109'482'240 + 768 * 2 + 2);
  CHECK(summarize(preset("vit-base")).params == 86'567'656);  // torchvision vit_b_16
  CHECK(summarize(preset("gpt2")).params == 124'439'808);     // GPT2LMHeadModel, tied head
  // The tied head owns no parameter: the graph has one [V, C] table.
  const ModelGraph gpt = build_gpt2(preset("gpt2"), 1);
  int tables = 0;
  for (const graph::FlatEntry& e : gpt.graph.param_layout())
    if (e.spec.shape == Shape{50257, 768}) ++tables;
  CHECK(tables == 1);
}

TEST_CASE("transformer graphs: shapes of inputs, labels, logits, positions vs seq_len") {
  const ModelGraph bert = build_model(preset("bert-base"), 2);
  CHECK(bert.graph.value(bert.input).spec == graph::TensorSpec{{2, 128}, DType::i32});
  CHECK(bert.graph.value(bert.labels).spec == graph::TensorSpec{{2, 128}, DType::i32});
  // The masked-LM head runs on round(0.15 * 128) = 19 gathered positions per sequence.
  CHECK(bert.graph.value(bert.logits).spec.shape == Shape{2, 19, 30522});
  CHECK(bert.graph.value(bert.targets).spec == graph::TensorSpec{{2, 19}, DType::i32});
  CHECK(bert.graph.param_layout()[1].name == "embeddings.position_embeddings.weight");
  CHECK(bert.graph.param_layout()[1].spec.shape == Shape{512, 768});
  const ModelGraph gpt = build_model(tiny("gpt2"), 3);
  CHECK(gpt.graph.value(gpt.logits).spec.shape == Shape{3, 8, 50});
  ModelOptions vit = tiny("vit-base");
  const ModelGraph v = build_model(vit, 2);
  CHECK(v.graph.value(v.input).spec.shape == Shape{2, 2, 8, 8});
  CHECK(v.graph.value(v.logits).spec.shape == Shape{2, 5});
  // Fashion-MNIST: 1 channel, 28 px, patch 7 -> 16 patches + the class token.
  vit.image_size = 28;
  vit.in_channels = 1;
  vit.patch_size = 7;
  vit.num_classes = 10;
  const ModelGraph fm = build_model(vit, 1);
  for (const graph::FlatEntry& e : fm.graph.param_layout())
    if (e.name == "encoder.embed.position_embeddings") CHECK(e.spec.shape == Shape{17, 16});
}

TEST_CASE("shape errors name the keys") {
  ModelOptions o = tiny("bert-base");
  o.heads = 3;
  CHECK_THROWS_WITH_AS(build_model(o, 1),
                       doctest::Contains("model.heads: 3 heads do not divide model.hidden = 16"),
                       Error);
  o = tiny("gpt2");
  o.seq_len = 13;
  CHECK_THROWS_WITH_AS(
      build_model(o, 1),
      doctest::Contains("model.seq_len: 13 is longer than model.max_positions = 12"), Error);
  o = tiny("vit-base");
  o.image_size = 28;
  o.patch_size = 5;
  CHECK_THROWS_WITH_AS(
      build_model(o, 1),
      doctest::Contains("model.patch_size: 5 does not divide model.image_size = 28"), Error);
  o = tiny("vit-base");
  o.hidden = 18;
  o.heads = 4;
  CHECK_THROWS_WITH_AS(build_model(o, 1), doctest::Contains("model.hidden = 18"), Error);
}

TEST_CASE("summaries of the transformers: per-sample FLOPs of the batch-1 graph") {
  for (const char* arch : {"bert-base", "vit-base", "gpt2"}) {
    CAPTURE(arch);
    const ModelOptions o = tiny(arch);
    const ModelSummary s = summarize(o);
    const ModelGraph two = build_model(o, 2);
    CHECK(s.params == two.graph.num_params());
    CHECK(s.forward_flops_per_sample == doctest::Approx(two.graph.forward_flops() / 2));
  }
  // GPT-2 small at 1,024 tokens: ~2 * params * T for the matmuls plus attention.
  const ModelSummary g = summarize(preset("gpt2"));
  const double matmul =
      2.0 * (124'439'808 - 50257.0 * 768 - 1024 * 768) * 1024 + 2.0 * 50257 * 768 * 1024;
  CHECK(g.forward_flops_per_sample > matmul);
  CHECK(g.forward_flops_per_sample < 1.3 * matmul);
}

TEST_CASE("BERT masked-LM head on the gathered positions: the loss and gradients of all T") {
  // Gathering 4 or all 8 rows per sequence (3 labelled, the rest padding) gives
  // the same model, loss and gradients; more labelled positions than rows is an Error.
  ModelOptions o = tiny("bert-base");
  auto run = [&](int rows, std::vector<float>* grads) {
    o.mlm_predictions = rows;
    const ModelGraph m = build_model(o, 2);
    graph::Executor ex(m.graph);
    ex.initialize(21);
    feed_lm(ex, m, 50, true);
    const float loss = loss_of(ex, m);
    ex.backward(m.loss);
    const Tensor g = ex.grads().flat(DType::f32);
    grads->assign(g.data<float>(), g.data<float>() + g.numel());
    return loss;
  };
  std::vector<float> g4, g8;
  const float l4 = run(4, &g4), l8 = run(8, &g8);
  CHECK(l4 == doctest::Approx(l8).epsilon(1e-6));
  REQUIRE(g4.size() == g8.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g4.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(g4[i]) - g8[i]));
    norm = std::max(norm, std::abs(static_cast<double>(g8[i])));
  }
  CHECK(norm > 0);
  CHECK(diff <= 1e-5 * norm);
  std::vector<float> unused;
  CHECK_THROWS_WITH_AS(run(2, &unused), doctest::Contains("more than 2 labelled positions"), Error);
}

TEST_CASE("tiny BERT masked-LM: whole-model gradients match finite differences") {
  const ModelGraph m = build_model(tiny("bert-base"), 2);
  graph::Executor ex(m.graph);
  ex.initialize(21);
  feed_lm(ex, m, 50, true);
  std::vector<Entry> entries = every_param(ex, m);
  // A word embedding row that is both an input token (embedding use) and scored by
  // the tied decoder: the gradient is the sum of both users'.
  const int64_t row = ids({1}, 50, 7, 3).data<int32_t>()[0];
  entries.push_back({"embeddings.word_embeddings.weight", row * 16 + 5});
  entries.push_back({"embeddings.position_embeddings.weight", 3 * 16 + 2});
  check_entries(ex, m, entries);
  // Position rows past seq_len are never used: exactly zero gradient.
  for (int64_t i = 8 * 16; i < 12 * 16; ++i)
    CHECK(grad_at(ex, "embeddings.position_embeddings.weight", i) == 0.0);
}

// A BERT classifier reads [CLS] text [SEP] then [PAD]s (vocab 50: [CLS] 47, [SEP] 48,
// [PAD] 49 here); attention hides the [PAD] keys, so a text's loss and every gradient
// are the same with 3 or 7 padding tokens after it (seq_len 8 or 12), and the [PAD]
// embedding row gets no gradient at all; without the mask (no pad_token_id) it does.
// Finite differences check the classifier's gradients through the mask.
TEST_CASE("BERT classifier: padding keys are masked, gradients match finite differences") {
  ModelOptions o = tiny("bert-base");
  o.num_classes = 3;
  o.mlm_predictions.reset();
  const auto feed = [](graph::Executor& ex, const ModelGraph& m) {
    const int64_t t = m.graph.value(m.input).spec.shape[1];
    Tensor in = Tensor::empty({2, t}, DType::i32);
    std::fill(in.data<int32_t>(), in.data<int32_t>() + in.numel(), 49);
    const int32_t rows[2][5] = {{47, 3, 4, 5, 48}, {47, 9, 48, 49, 49}};
    for (int b = 0; b < 2; ++b) std::copy(rows[b], rows[b] + 5, in.data<int32_t>() + b * t);
    ex.set_input(m.input, in);
    ex.set_input(m.labels, ids({2}, 3, 1, 1));
  };
  double pad_grad = 0;  // the largest |gradient| of the [PAD] word embedding, last run
  const auto run = [&](int seq_len, std::optional<int> pad, std::vector<float>* grads) {
    o.seq_len = seq_len;
    o.pad_token_id = pad;
    const ModelGraph m = build_model(o, 2);
    graph::Executor ex(m.graph);
    ex.initialize(21);
    feed(ex, m);
    const float loss = loss_of(ex, m);
    ex.backward(m.loss);
    const Tensor g = ex.grads().flat(DType::f32);
    grads->assign(g.data<float>(), g.data<float>() + g.numel());
    const float* row = ex.grads().view("embeddings.word_embeddings.weight").data<float>() + 49 * 16;
    pad_grad = 0;
    for (int i = 0; i < 16; ++i) pad_grad = std::max(pad_grad, std::abs(double{row[i]}));
    return loss;
  };
  std::vector<float> g8, g12, unmasked;
  const float l8 = run(8, 49, &g8);
  CHECK(pad_grad == 0.0);
  const float l12 = run(12, 49, &g12);
  CHECK(pad_grad == 0.0);
  CHECK(l8 == doctest::Approx(l12).epsilon(1e-6));
  REQUIRE(g8.size() == g12.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g8.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(g8[i]) - g12[i]));
    norm = std::max(norm, std::abs(static_cast<double>(g12[i])));
  }
  CHECK(norm > 0);
  CHECK(diff <= 1e-5 * norm);
  run(12, std::nullopt, &unmasked);
  CHECK(pad_grad > 1e-6);

  o.seq_len = 8;
  o.pad_token_id = 49;
  const ModelGraph m = build_model(o, 2);
  graph::Executor ex(m.graph);
  ex.initialize(21);
  feed(ex, m);
  check_entries(ex, m, every_param(ex, m));
}

TEST_CASE("tiny GPT-2: whole-model gradients match finite differences") {
  const ModelGraph m = build_model(tiny("gpt2"), 2);
  graph::Executor ex(m.graph);
  ex.initialize(22);
  feed_lm(ex, m, 50, false);
  std::vector<Entry> entries = every_param(ex, m);
  const int64_t row = ids({1}, 50, 7, 3).data<int32_t>()[0];
  entries.push_back({"transformer.word_embeddings.weight", row * 16 + 1});
  entries.push_back({"transformer.position_embeddings.weight", 5 * 16 + 7});
  entries.push_back(largest(ex, m, "transformer.position_embeddings.weight", 8));
  check_entries(ex, m, entries);
}

TEST_CASE("tiny ViT: whole-model gradients match finite differences") {
  const ModelGraph m = build_model(tiny("vit-base"), 2);
  graph::Executor ex(m.graph);
  ex.initialize(23);
  feed_images(ex, m, 5);
  std::vector<Entry> entries = every_param(ex, m);
  entries.push_back({"encoder.embed.class_token", 4});
  entries.push_back({"encoder.embed.position_embeddings", 2 * 16 + 9});
  check_entries(ex, m, entries);
}

TEST_CASE("a tiny GPT-2 memorises a fixed token sequence with AdamW") {
  ModelOptions o = tiny("gpt2");
  o.hidden = 32;
  o.ffn = 64;
  o.vocab_size = 16;
  o.seq_len = 16;
  o.max_positions = 16;
  const ModelGraph m = build_model(o, 1);
  graph::Executor ex(m.graph);
  ex.initialize(5);
  // tokens s[0..16]; the model reads s[0..15] and predicts s[1..16].
  Tensor seq = ids({17}, 16, 5, 2);
  Tensor in = Tensor::empty({1, 16}, DType::i32), next = Tensor::empty({1, 16}, DType::i32);
  std::copy_n(seq.data<int32_t>(), 16, in.data<int32_t>());
  std::copy_n(seq.data<int32_t>() + 1, 16, next.data<int32_t>());
  ex.set_input(m.input, in);
  ex.set_input(m.labels, next);

  std::vector<optim::ParamSegment> segments;
  for (const graph::FlatEntry& e : ex.params().entries())
    segments.push_back({e.name, e.offset, e.spec.shape.numel(), optim::DecayMode::decay});
  OptimizerOptions opts;
  opts.lr = 1e-2;
  opts.weight_decay = 0.0;
  Tensor params = ex.params().flat(DType::f32), grads = ex.grads().flat(DType::f32);
  auto opt = optim::make_optimizer(opts, segments, params.numel());
  float first = 0, loss = 0;
  int steps = 0;
  for (; steps < 300; ++steps) {
    ex.forward(graph::Mode::train, static_cast<uint64_t>(steps));
    loss = ex.value(m.loss).data<float>()[0];
    if (steps == 0) first = loss;
    if (loss < 0.05f) break;
    ex.backward(m.loss);
    opt->step(params, grads, opts.lr);
  }
  MESSAGE("tiny GPT-2: loss ", first, " -> ", loss, " in ", steps, " AdamW steps");
  CHECK(first > 2.0f);  // ~ln 16 at initialisation
  CHECK(loss < 0.05f);
}
