// The name tables of export_names.h. Most of our names already are the reference's
// (the model builders name their nodes after its state-dict keys); the rules below
// list only what differs, first match wins, matched on a dot-separated suffix of our
// name. A split rule cuts a fused [3C, ...] tensor into three [C, ...] tensors.
#include "runtime/export_names.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace dtrain::runtime {

namespace {

enum class Transform : uint8_t {
  same,          // renamed at most
  transpose,     // [out, in] -> [in, out] (Hugging Face Conv1D)
  split_qkv,     // [3C, ...] -> three [C, ...]: query, key, value
  leading_ones,  // [C] -> [1, 1, C], [T, C] -> [1, T, C] (torchvision ViT)
  patches,       // [hidden, C*P*P] -> [hidden, C, P, P] (our patch features are (c, y, x))
};

struct Rule {
  ModelFamily family;
  std::string_view ours;   // a suffix of our name at a '.' boundary, or the whole name
  std::string_view torch;  // what replaces it; for split_qkv three names separated by '|'
  Transform how = Transform::same;
};

using enum ModelFamily;

constexpr Rule kRules[] = {
    // GPT-2 -> GPT2LMHeadModel. lm_head.weight is wte (tied): not a tensor of ours.
    {gpt, "transformer.word_embeddings.weight", "transformer.wte.weight"},
    {gpt, "transformer.position_embeddings.weight", "transformer.wpe.weight"},
    {gpt, "attn.c_attn.weight", "attn.c_attn.weight", Transform::transpose},
    {gpt, "attn.c_proj.weight", "attn.c_proj.weight", Transform::transpose},
    {gpt, "mlp.c_fc.weight", "mlp.c_fc.weight", Transform::transpose},
    {gpt, "mlp.c_proj.weight", "mlp.c_proj.weight", Transform::transpose},
    // BERT -> BertForMaskedLM (every name but the heads' under "bert."). The decoder's
    // weight is the word table (tied); its bias is the head's own.
    {bert, "attention.self.qkv.weight",
     "attention.self.query.weight|attention.self.key.weight|attention.self.value.weight",
     Transform::split_qkv},
    {bert, "attention.self.qkv.bias",
     "attention.self.query.bias|attention.self.key.bias|attention.self.value.bias",
     Transform::split_qkv},
    {bert, "cls.predictions.decoder.bias", "cls.predictions.bias"},
    // ViT -> torchvision VisionTransformer.
    {vit, "conv_proj.weight", "conv_proj.weight", Transform::patches},
    {vit, "encoder.embed.class_token", "class_token", Transform::leading_ones},
    {vit, "encoder.embed.position_embeddings", "encoder.pos_embedding", Transform::leading_ones},
    {vit, "self_attention.in_proj.weight", "self_attention.in_proj_weight"},
    {vit, "self_attention.in_proj.bias", "self_attention.in_proj_bias"},
    // ResNet -> torchvision ResNet: the same names (num_batches_tracked is not exported).
};

// Names of a reference file that dtrain skips on import (export_names.h).
constexpr std::pair<ModelFamily, std::string_view> kIgnored[] = {
    {cnn, "num_batches_tracked"},
    {gpt, "attn.bias"},
    {gpt, "attn.masked_bias"},
    {gpt, "lm_head.weight"},
    {bert, "embeddings.position_ids"},
    {bert, "cls.predictions.decoder.weight"},
    {bert, "cls.predictions.decoder.bias"},
};

bool has_suffix(std::string_view name, std::string_view suffix) {
  if (name.size() < suffix.size() || name.substr(name.size() - suffix.size()) != suffix)
    return false;
  return name.size() == suffix.size() || name[name.size() - suffix.size() - 1] == '.';
}

std::string with_prefix(ModelFamily family, std::string name) {
  if (family == bert && name.rfind("cls.", 0) != 0 && name.rfind("classifier.", 0) != 0)
    return "bert." + name;
  return name;
}

[[noreturn]] void bad_shape(const graph::FlatEntry& e, std::string_view expected) {
  throw Error(
      fmt::format("tensor {} is {}; exporting it needs {}", e.name, e.spec.shape.str(), expected),
      "the checkpoint's layout does not match its architecture's family");
}

bool is_square(int64_t n, int64_t* root) {
  const auto r = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  *root = r;
  return r > 0 && r * r == n;
}

// [hidden, C*P*P] -> [hidden, C, P, P]. The layout does not record C: images have 3 or 1
// channels, and F = C*P*P tells them apart (3*P*P is never a square, P*P always is).
Shape patch_shape(const graph::FlatEntry& e) {
  const Shape& s = e.spec.shape;
  if (s.rank() != 2) bad_shape(e, "[hidden, channels x patch x patch]");
  int64_t p = 0;
  if (s[1] % 3 == 0 && is_square(s[1] / 3, &p)) return {s[0], 3, p, p};
  if (is_square(s[1], &p)) return {s[0], 1, p, p};
  throw Error(fmt::format("tensor {} is {}: {} patch features are neither 3 x P x P nor P x P",
                          e.name, s.str(), s[1]),
              "only 1- and 3-channel ViTs export to torchvision's conv_proj [hidden, C, P, P]");
}

void add_entry(std::vector<ExportTensor>& out, ModelFamily family, StoreKind store, int index,
               const graph::FlatEntry& e) {
  const Shape& s = e.spec.shape;
  const int64_t rows = s.rank() == 0 ? 1 : s[0];
  ExportTensor t{with_prefix(family, e.name), s, store, index, 0, rows, false};
  for (const Rule& r : kRules) {
    if (r.family != family || !has_suffix(e.name, r.ours)) continue;
    const std::string stem = e.name.substr(0, e.name.size() - r.ours.size());
    t.name = with_prefix(family, stem + std::string(r.torch));
    switch (r.how) {
      case Transform::same:
        break;
      case Transform::transpose:
        if (s.rank() != 2) bad_shape(e, "[out, in]");
        t.shape = {s[1], s[0]};
        t.transpose = true;
        break;
      case Transform::leading_ones:
        if (s.rank() > 3) bad_shape(e, "at most 3 dimensions");
        t.shape = {};
        for (int i = s.rank(); i < 3; ++i) t.shape.push_back(1);
        for (int64_t d : s) t.shape.push_back(d);
        break;
      case Transform::patches:
        t.shape = patch_shape(e);
        break;
      case Transform::split_qkv: {
        if (s.rank() < 1 || s[0] % 3 != 0) bad_shape(e, "[3 x hidden, ...]");
        std::string_view names = r.torch;
        for (int part = 0; part < 3; ++part) {
          const size_t bar = names.find('|');
          ExportTensor p = t;
          p.name = with_prefix(family, stem + std::string(names.substr(0, bar)));
          p.shape[0] = s[0] / 3;
          p.row_begin = part * (s[0] / 3);
          p.rows = s[0] / 3;
          out.push_back(std::move(p));
          names = bar == std::string_view::npos ? "" : names.substr(bar + 1);
        }
        return;
      }
    }
    break;
  }
  out.push_back(std::move(t));
}

}  // namespace

ModelFamily family_of(std::string_view arch) {
  const ArchPreset* a = find_arch(arch);
  if (a == nullptr) {
    throw Error(fmt::format("unknown architecture \"{}\"", arch),
                "expected one of dtrain's model.arch names (resnet18, gpt2-tiny, bert-base, ...)");
  }
  return a->family;
}

std::vector<ExportTensor> export_plan(ModelFamily family,
                                      const std::vector<graph::FlatEntry>& params,
                                      const std::vector<graph::FlatEntry>& buffers) {
  std::vector<ExportTensor> out;
  for (size_t i = 0; i < params.size(); ++i)
    add_entry(out, family, StoreKind::params, static_cast<int>(i), params[i]);
  for (size_t i = 0; i < buffers.size(); ++i)
    add_entry(out, family, StoreKind::buffers, static_cast<int>(i), buffers[i]);
  return out;
}

bool ignored_on_import(ModelFamily family, std::string_view name) {
  for (const auto& [f, suffix] : kIgnored)
    if (f == family && has_suffix(name, suffix)) return true;
  return false;
}

bool is_head_tensor(ModelFamily family, std::string_view name) {
  const auto starts = [&](std::string_view prefix) { return name.rfind(prefix, 0) == 0; };
  switch (family) {
    case cnn:
      return starts("fc.");
    case vit:
      return starts("heads.");
    case bert:
      return starts("cls.") || starts("bert.pooler.") || starts("classifier.");
    case gpt:
      return false;  // its head is the word table (tied)
  }
  return false;
}

std::string canonical_import_name(ModelFamily family, std::string_view name) {
  if (family == gpt && name.rfind("transformer.", 0) != 0 && name.rfind("lm_head.", 0) != 0)
    return "transformer." + std::string(name);
  return std::string(name);
}

std::vector<graph::FlatEntry> layout_from_meta(const nlohmann::json& list) {
  std::vector<graph::FlatEntry> entries;
  for (const nlohmann::json& row : list) {
    graph::FlatEntry e;
    e.name = row.at(0).get<std::string>();
    e.spec.name = e.name;
    e.spec.dtype = parse_dtype(row.at(1).get<std::string>());
    const auto dims = row.at(2).get<std::vector<int64_t>>();
    e.spec.shape = Shape(dims.begin(), dims.end());
    entries.push_back(std::move(e));
  }
  return graph::FlatStore(std::move(entries)).entries();  // offsets as the trainer's
}

Tensor to_reference(const ExportTensor& t, const Tensor& ours) {
  DTRAIN_CHECK(ours.dtype() == DType::f32, "to_reference: {} is {}", t.name, ours.str());
  const int64_t all_rows = ours.rank() == 0 ? 1 : ours.dim(0);
  const int64_t cols = ours.numel() / all_rows;
  DTRAIN_CHECK(t.row_begin + t.rows <= all_rows && t.shape.numel() == t.rows * cols,
               "to_reference: {} {} from {}", t.name, t.shape.str(), ours.str());
  Tensor out = Tensor::empty(t.shape, DType::f32);
  const float* src = ours.data<float>() + t.row_begin * cols;
  float* dst = out.data<float>();
  if (!t.transpose) {
    std::memcpy(dst, src, static_cast<size_t>(t.rows * cols) * sizeof(float));
    return out;
  }
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * t.rows + r] = src[r * cols + c];
  return out;
}

void from_reference(const ExportTensor& t, const Tensor& reference, Tensor& ours) {
  DTRAIN_CHECK(
      ours.dtype() == DType::f32 && reference.dtype() == DType::f32 && reference.shape() == t.shape,
      "from_reference: {} {} into {}", t.name, reference.str(), ours.str());
  const int64_t all_rows = ours.rank() == 0 ? 1 : ours.dim(0);
  const int64_t cols = ours.numel() / all_rows;
  DTRAIN_CHECK(t.row_begin + t.rows <= all_rows && t.shape.numel() == t.rows * cols,
               "from_reference: {} {} into {}", t.name, t.shape.str(), ours.str());
  const float* src = reference.data<float>();
  float* dst = ours.data<float>() + t.row_begin * cols;
  if (!t.transpose) {
    std::memcpy(dst, src, static_cast<size_t>(t.rows * cols) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[c * t.rows + r];
}

}  // namespace dtrain::runtime
