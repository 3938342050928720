// BERT graph construction; node names follow Hugging Face's state-dict keys
// ("encoder.layer.0.attention.output.LayerNorm"), except that query, key and
// value are one fused projection ("attention.self.qkv", weight [3C, C]).
#include "models/bert.h"

#include "models/transformer.h"

namespace dtrain::models {
namespace {

using graph::Bias;
using graph::Graph;
using graph::ValueId;

constexpr float kLnEps = 1e-12f;

ValueId layer_norm(Graph& g, const std::string& name, ValueId x, int64_t c) {
  return g.add1(name, graph::layer_norm(c, kLnEps), {x});
}

ValueId encoder_layer(Graph& g, const std::string& p, ValueId x, const TransformerShape& s,
                      ValueId key_mask) {
  ValueId a = attention_block(
      g, {p + ".attention.self.qkv", p + ".attention.self", p + ".attention.output.dense"}, x, s,
      kernels::Causal::no, kInitStd, key_mask);
  a = maybe_dropout(g, p + ".attention.output.dropout", a, s.dropout);
  x = g.add1(p + ".attention.output.residual", graph::add(), {x, a});
  x = layer_norm(g, p + ".attention.output.LayerNorm", x, s.hidden);
  ValueId f =
      mlp_block(g, {p + ".intermediate.dense", p + ".intermediate.gelu", p + ".output.dense"}, x, s,
                kernels::Activation::gelu_erf);
  f = maybe_dropout(g, p + ".output.dropout", f, s.dropout);
  x = g.add1(p + ".output.residual", graph::add(), {x, f});
  return layer_norm(g, p + ".output.LayerNorm", x, s.hidden);
}

// Pooler: tanh(dense(x[:, 0])) [B, C]
ValueId pooler(Graph& g, ValueId x, const TransformerShape& s) {
  ValueId h = g.add1("pooler.select", graph::select_token(0), {x});
  h = g.add1("pooler.dense", graph::linear(s.hidden, s.hidden, Bias::yes, {kInitStd}), {h});
  return g.add1("pooler.activation", graph::activation(kernels::Activation::tanh), {h});
}

// The labelled positions of each sequence (M rows), transform (dense + GELU +
// LN), then the decoder whose weight is the word embedding table. Hugging Face
// runs the head on all T positions and ignores the unlabelled ones in the loss;
// gathering first gives the same loss and gradients for ~M/T of the head's work
// (the decoder is V x C: a fifth of BERT-base's step at T = 128 otherwise).
ValueId mlm_head(Graph& g, ValueId x, ValueId labels, int64_t predictions,
                 const TransformerShape& s, ValueId* targets) {
  const int64_t c = s.hidden;
  const std::vector<ValueId> picked =
      g.add("cls.predictions.gather", graph::gather_labeled(predictions), {x, labels});
  *targets = picked[1];
  ValueId h = g.add1("cls.predictions.transform.dense", graph::linear(c, c, Bias::yes, {kInitStd}),
                     {picked[0]});
  h = g.add1("cls.predictions.transform.gelu", graph::activation(kernels::Activation::gelu_erf),
             {h});
  h = layer_norm(g, "cls.predictions.transform.LayerNorm", h, c);
  const int word = g.param_index("embeddings.word_embeddings.weight");
  return g.add1("cls.predictions.decoder", graph::linear(c, s.vocab, Bias::yes, {kInitStd}), {h},
                {{0, word}});
}

}  // namespace

ModelGraph build_bert(const ModelOptions& options, int64_t batch, BertHead head,
                      const graph::DTypePolicy& policy) {
  const TransformerShape s = resolve_transformer(options, ModelFamily::bert);
  if (head == BertHead::classifier && !s.classes) {
    throw Error("model.num_classes: a BERT classifier needs num_classes",
                "leave num_classes unset for masked-LM pretraining");
  }
  ModelGraph m;
  Graph& g = m.graph;
  g.set_policy(policy);
  m.input = g.input("input_ids", {batch, s.seq_len}, DType::i32);
  // A classifier reads one text per row, [CLS] text [SEP] then [PAD]s: attention sees no
  // padding (Hugging Face's attention_mask). Masked-LM windows are all text.
  const ValueId key_mask =
      head == BertHead::masked_lm
          ? -1
          : g.add1("embeddings.padding_mask",
                   graph::padding_mask(options.pad_token_id.value_or(-1)), {m.input});
  ValueId x = g.add1("embeddings", graph::token_embedding({s.vocab, s.max_positions, 2, s.hidden}),
                     {m.input});
  x = layer_norm(g, "embeddings.LayerNorm", x, s.hidden);
  x = maybe_dropout(g, "embeddings.dropout", x, s.dropout);
  for (int64_t i = 0; i < s.layers; ++i) {
    g.begin_block();  // a transformer layer: the unit activation checkpointing recomputes
    x = encoder_layer(g, fmt::format("encoder.layer.{}", i), x, s, key_mask);
    g.end_block();
  }
  if (head == BertHead::pooler) {
    m.logits = pooler(g, x, s);
    return m;
  }
  if (head == BertHead::masked_lm) {
    m.labels = g.input("labels", {batch, s.seq_len}, DType::i32);
    const int64_t predictions =
        options.mlm_predictions.value_or(masked_lm_predictions(s.seq_len, 0.15));
    m.logits = mlm_head(g, x, m.labels, predictions, s, &m.targets);
  } else {
    m.labels = g.input("labels", {batch}, DType::i32);
    ValueId h = maybe_dropout(g, "classifier.dropout", pooler(g, x, s), s.dropout);
    m.logits =
        g.add1("classifier", graph::linear(s.hidden, *s.classes, Bias::yes, {kInitStd}), {h});
  }
  if (m.targets < 0) m.targets = m.labels;
  m.loss = g.add1("loss",
                  graph::softmax_cross_entropy(-100, static_cast<float>(options.label_smoothing)),
                  {m.logits, m.targets});
  return m;
}

ModelGraph build_bert(const ModelOptions& options, int64_t batch,
                      const graph::DTypePolicy& policy) {
  return build_bert(options, batch,
                    options.num_classes ? BertHead::classifier : BertHead::masked_lm, policy);
}

}  // namespace dtrain::models
