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

ValueId encoder_layer(Graph& g, const std::string& p, ValueId x, const TransformerShape& s) {
  ValueId a = attention_block(
      g, {p + ".attention.self.qkv", p + ".attention.self", p + ".attention.output.dense"}, x, s,
      kernels::Causal::no);
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

// Transform (dense + GELU + LN), then the decoder whose weight is the word embedding table.
ValueId mlm_head(Graph& g, ValueId x, const TransformerShape& s) {
  const int64_t c = s.hidden;
  ValueId h =
      g.add1("cls.predictions.transform.dense", graph::linear(c, c, Bias::yes, {kInitStd}), {x});
  h = g.add1("cls.predictions.transform.gelu", graph::activation(kernels::Activation::gelu_erf),
             {h});
  h = layer_norm(g, "cls.predictions.transform.LayerNorm", h, c);
  const int word = g.param_index("embeddings.word_embeddings.weight");
  return g.add1("cls.predictions.decoder", graph::linear(c, s.vocab, Bias::yes, {kInitStd}), {h},
                {{0, word}});
}

}  // namespace

ModelGraph build_bert(const ModelOptions& options, int64_t batch, BertHead head) {
  const TransformerShape s = resolve_transformer(options, ModelFamily::bert);
  if (head == BertHead::classifier && !s.classes) {
    throw Error("model.num_classes: a BERT classifier needs num_classes",
                "leave num_classes unset for masked-LM pretraining");
  }
  ModelGraph m;
  Graph& g = m.graph;
  m.input = g.input("input_ids", {batch, s.seq_len}, DType::i32);
  ValueId x = g.add1("embeddings", graph::token_embedding({s.vocab, s.max_positions, 2, s.hidden}),
                     {m.input});
  x = layer_norm(g, "embeddings.LayerNorm", x, s.hidden);
  x = maybe_dropout(g, "embeddings.dropout", x, s.dropout);
  for (int64_t i = 0; i < s.layers; ++i)
    x = encoder_layer(g, fmt::format("encoder.layer.{}", i), x, s);
  if (head == BertHead::pooler) {
    m.logits = pooler(g, x, s);
    return m;
  }
  if (head == BertHead::masked_lm) {
    m.labels = g.input("labels", {batch, s.seq_len}, DType::i32);
    m.logits = mlm_head(g, x, s);
  } else {
    m.labels = g.input("labels", {batch}, DType::i32);
    ValueId h = maybe_dropout(g, "classifier.dropout", pooler(g, x, s), s.dropout);
    m.logits =
        g.add1("classifier", graph::linear(s.hidden, *s.classes, Bias::yes, {kInitStd}), {h});
  }
  m.loss = g.add1("loss", graph::softmax_cross_entropy(-100), {m.logits, m.labels});
  return m;
}

ModelGraph build_bert(const ModelOptions& options, int64_t batch) {
  return build_bert(options, batch,
                    options.num_classes ? BertHead::classifier : BertHead::masked_lm);
}

}  // namespace dtrain::models
