// Shape resolution and the shared sub-blocks of the transformer builders.
#include "models/transformer.h"

#include <utility>

#include "core/error.h"

namespace dtrain::models {

namespace {

void require_positive(const char* key, int64_t v) {
  if (v <= 0) throw Error(fmt::format("model.{}: expected a positive integer, got {}", key, v));
}

void check_shape(const TransformerShape& s, ModelFamily family) {
  for (auto [key, v] : {std::pair{"layers", s.layers}, std::pair{"hidden", s.hidden},
                        std::pair{"heads", s.heads}, std::pair{"ffn", s.ffn}}) {
    require_positive(key, v);
  }
  if (s.hidden % s.heads != 0) {
    throw Error(
        fmt::format("model.heads: {} heads do not divide model.hidden = {}", s.heads, s.hidden),
        "each attention head gets hidden / heads dimensions; choose heads dividing hidden");
  }
  if (!(s.dropout >= 0.0 && s.dropout < 1.0)) {
    throw Error(fmt::format("model.dropout: {} is not in [0, 1)", s.dropout));
  }
  if (s.classes) require_positive("num_classes", *s.classes);
  if (family == ModelFamily::vit) {
    require_positive("image_size", s.image);
    require_positive("patch_size", s.patch);
    require_positive("in_channels", s.channels);
    if (s.image % s.patch != 0) {
      throw Error(fmt::format("model.patch_size: {} does not divide model.image_size = {}", s.patch,
                              s.image),
                  "the image is cut into (image_size / patch_size)^2 whole patches");
    }
    return;
  }
  require_positive("vocab_size", s.vocab);
  require_positive("seq_len", s.seq_len);
  require_positive("max_positions", s.max_positions);
  if (s.seq_len > s.max_positions) {
    throw Error(fmt::format("model.seq_len: {} is longer than model.max_positions = {}", s.seq_len,
                            s.max_positions),
                "the learned position table has max_positions rows; shorten seq_len");
  }
}

}  // namespace

TransformerShape resolve_transformer(const ModelOptions& o, ModelFamily family) {
  const ArchPreset* arch = find_arch(o.arch);
  DTRAIN_CHECK(arch != nullptr && arch->family == family, "{} is not a {}", o.arch,
               to_string(family));
  const ModelOptions p = preset_options(*arch);
  TransformerShape s;
  s.layers = o.layers.value_or(*p.layers);
  s.hidden = o.hidden.value_or(*p.hidden);
  s.heads = o.heads.value_or(*p.heads);
  s.ffn = o.ffn.value_or(o.hidden ? 4 * *o.hidden : *p.ffn);
  s.dropout = o.dropout.value_or(*p.dropout);
  if (o.num_classes) s.classes = *o.num_classes;
  if (family == ModelFamily::vit) {
    s.image = o.image_size.value_or(*p.image_size);
    s.patch = o.patch_size.value_or(*p.patch_size);
    s.channels = o.in_channels.value_or(*p.in_channels);
    s.classes = o.num_classes.value_or(*p.num_classes);
  } else {
    s.vocab = o.vocab_size.value_or(*p.vocab_size);
    s.seq_len = o.seq_len.value_or(*p.seq_len);
    s.max_positions = o.max_positions.value_or(*p.max_positions);
  }
  check_shape(s, family);
  return s;
}

graph::ValueId attention_block(graph::Graph& g, const AttentionNames& names, graph::ValueId x,
                               const TransformerShape& s, kernels::Causal causal, double proj_std,
                               graph::ValueId key_mask) {
  using graph::Bias;
  const int64_t c = s.hidden;
  graph::ValueId h = g.add1(names.qkv, graph::linear(c, 3 * c, Bias::yes, {kInitStd}), {x});
  // Attention-probability dropout at the hidden rate (BERT's attention_probs_dropout_prob
  // and GPT-2's attn_pdrop equal hidden dropout in every released size).
  const bool masked = key_mask >= 0;
  h = g.add1(
      names.core,
      graph::self_attention(s.heads, causal, masked ? graph::KeyMask::input : graph::KeyMask::none,
                            static_cast<float>(s.dropout)),
      masked ? std::vector<graph::ValueId>{h, key_mask} : std::vector<graph::ValueId>{h});
  return g.add1(names.proj, graph::linear(c, c, Bias::yes, {proj_std}), {h});
}

graph::ValueId mlp_block(graph::Graph& g, const MlpNames& names, graph::ValueId x,
                         const TransformerShape& s, kernels::Activation act, double fc2_std) {
  using graph::Bias;
  graph::ValueId h;
  if (act == kernels::Activation::gelu_tanh) {  // GPT-2: GELU in the GEMM's epilogue
    h = g.add1(names.fc1, graph::linear_gelu(s.hidden, s.ffn, {kInitStd}), {x});
  } else {
    h = g.add1(names.fc1, graph::linear(s.hidden, s.ffn, Bias::yes, {kInitStd}), {x});
    h = g.add1(names.act, graph::activation(act), {h});
  }
  return g.add1(names.fc2, graph::linear(s.ffn, s.hidden, Bias::yes, {fc2_std}), {h});
}

graph::ValueId maybe_dropout(graph::Graph& g, const std::string& name, graph::ValueId x, double p) {
  if (p == 0.0) return x;
  return g.add1(name, graph::dropout(static_cast<float>(p)), {x});
}

}  // namespace dtrain::models
