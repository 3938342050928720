// GPT-2 graph construction; node names follow Hugging Face's state-dict keys
// ("transformer.h.0.attn.c_attn"), with the token and position tables in one
// "transformer" embedding node (transformer.word_embeddings.weight = wte).
#include "models/gpt2.h"

#include <cmath>

#include "models/transformer.h"

namespace dtrain::models {
namespace {

using graph::Graph;
using graph::ValueId;

constexpr float kLnEps = kGpt2LayerNormEps;

ValueId block(Graph& g, const std::string& p, ValueId x, const TransformerShape& s) {
  const double resid_std = kInitStd / std::sqrt(2.0 * static_cast<double>(s.layers));
  ValueId h = g.add1(p + ".ln_1", graph::layer_norm(s.hidden, kLnEps), {x});
  h = attention_block(g, {p + ".attn.c_attn", p + ".attn", p + ".attn.c_proj"}, h, s,
                      kernels::Causal::yes, resid_std);
  h = maybe_dropout(g, p + ".attn.resid_dropout", h, s.dropout);
  x = g.add1(p + ".residual_1", graph::add(), {x, h});
  h = g.add1(p + ".ln_2", graph::layer_norm(s.hidden, kLnEps), {x});
  h = mlp_block(g, {p + ".mlp.c_fc", p + ".mlp.gelu", p + ".mlp.c_proj"}, h, s,
                kernels::Activation::gelu_tanh, resid_std);
  h = maybe_dropout(g, p + ".mlp.dropout", h, s.dropout);
  return g.add1(p + ".residual_2", graph::add(), {x, h});
}

}  // namespace

ModelGraph build_gpt2(const ModelOptions& options, int64_t batch,
                      const graph::DTypePolicy& policy) {
  const TransformerShape s = resolve_transformer(options, ModelFamily::gpt);
  ModelGraph m;
  Graph& g = m.graph;
  g.set_policy(policy);
  m.input = g.input("input_ids", {batch, s.seq_len}, DType::i32);
  m.labels = g.input("labels", {batch, s.seq_len}, DType::i32);
  ValueId x = g.add1("transformer", graph::token_embedding({s.vocab, s.max_positions, 0, s.hidden}),
                     {m.input});
  x = maybe_dropout(g, "transformer.drop", x, s.dropout);
  for (int64_t i = 0; i < s.layers; ++i) {
    g.begin_block();  // a transformer layer: the unit activation checkpointing recomputes
    x = block(g, fmt::format("transformer.h.{}", i), x, s);
    g.end_block();
  }
  x = g.add1("transformer.ln_f", graph::layer_norm(s.hidden, kLnEps), {x});
  const int wte = g.param_index("transformer.word_embeddings.weight");
  m.logits = g.add1("lm_head", graph::linear(s.hidden, s.vocab, graph::Bias::no, {kInitStd}), {x},
                    {{0, wte}});
  m.loss = g.add1("loss",
                  graph::softmax_cross_entropy(-100, static_cast<float>(options.label_smoothing)),
                  {m.logits, m.labels});
  return m;
}

}  // namespace dtrain::models
