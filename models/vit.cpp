// ViT graph construction; node names follow torchvision's state-dict keys
// ("encoder.layers.encoder_layer_0.mlp.0"), with the class token and the
// position table in one "encoder.embed" node.
#include "models/vit.h"

#include "models/transformer.h"

namespace dtrain::models {
namespace {

using graph::Bias;
using graph::Graph;
using graph::ValueId;

constexpr float kLnEps = 1e-6f;

ValueId block(Graph& g, const std::string& p, ValueId x, const TransformerShape& s) {
  ValueId h = g.add1(p + ".ln_1", graph::layer_norm(s.hidden, kLnEps), {x});
  h = attention_block(
      g, {p + ".self_attention.in_proj", p + ".self_attention", p + ".self_attention.out_proj"}, h,
      s, kernels::Causal::no);
  h = maybe_dropout(g, p + ".dropout", h, s.dropout);
  x = g.add1(p + ".residual_1", graph::add(), {x, h});
  h = g.add1(p + ".ln_2", graph::layer_norm(s.hidden, kLnEps), {x});
  h = mlp_block(g, {p + ".mlp.0", p + ".mlp.1", p + ".mlp.3"}, h, s, kernels::Activation::gelu_erf);
  h = maybe_dropout(g, p + ".mlp.dropout", h, s.dropout);
  return g.add1(p + ".residual_2", graph::add(), {x, h});
}

}  // namespace

ModelGraph build_vit(const ModelOptions& options, int64_t batch, const graph::DTypePolicy& policy) {
  const TransformerShape s = resolve_transformer(options, ModelFamily::vit);
  const int64_t side = s.image / s.patch, tokens = side * side;
  const int64_t patch_features = s.channels * s.patch * s.patch;
  ModelGraph m;
  Graph& g = m.graph;
  g.set_policy(policy);
  m.input = g.input("images", {batch, s.channels, s.image, s.image}, DType::f32);
  m.labels = g.input("labels", {batch}, DType::i32);
  const ValueId images =
      policy.half() ? g.add1("to_compute", graph::to_compute_dtype(), {m.input}) : m.input;
  ValueId x = g.add1("conv_proj.patchify", graph::patchify(s.patch), {images});
  x = g.add1("conv_proj", graph::linear(patch_features, s.hidden, Bias::yes), {x});
  x = g.add1("encoder.embed", graph::class_token_positions(tokens, s.hidden, kInitStd), {x});
  x = maybe_dropout(g, "encoder.dropout", x, s.dropout);
  for (int64_t i = 0; i < s.layers; ++i) {
    g.begin_block();  // a transformer layer: the unit activation checkpointing recomputes
    x = block(g, fmt::format("encoder.layers.encoder_layer_{}", i), x, s);
    g.end_block();
  }
  x = g.add1("encoder.ln", graph::layer_norm(s.hidden, kLnEps), {x});
  x = g.add1("heads.select", graph::select_token(0), {x});
  m.logits = g.add1("heads.head", graph::linear(s.hidden, *s.classes, Bias::yes, {kInitStd}), {x});
  m.loss = g.add1("loss",
                  graph::softmax_cross_entropy(-100, static_cast<float>(options.label_smoothing)),
                  {m.logits, m.labels});
  return m;
}

}  // namespace dtrain::models
