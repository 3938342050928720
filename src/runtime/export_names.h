// Our parameter and buffer names <-> the reference implementations' state-dict keys
// (torchvision ResNet and ViT, Hugging Face BertForMaskedLM and GPT2LMHeadModel), for
// `dtrain ckpt export --safetensors` and `model.init_from`. One table per family says
// which of our tensors become which PyTorch tensors (renamed, split, transposed,
// reshaped); both directions read the same plan. No file I/O here.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "graph/params.h"
#include "models/options.h"

namespace dtrain::runtime {

enum class StoreKind : uint8_t { params, buffers };

// One PyTorch tensor and where its numbers live in ours: rows [row_begin, row_begin
// + rows) of our tensor `ours` (seen as [R, numel / R]; a vector as [R, 1]), transposed
// when `transpose` (Hugging Face GPT-2's Conv1D keeps [in, out]), read row-major as
// `shape`.
struct ExportTensor {
  std::string name;  // "transformer.h.0.attn.c_attn.weight"
  Shape shape;       // its shape in the reference implementation
  StoreKind store = StoreKind::params;
  int entry = -1;  // index into that store's layout
  int64_t row_begin = 0, rows = 0;
  bool transpose = false;
};

// The family of an architecture name ("gpt2-tiny" -> gpt), or an Error naming it.
ModelFamily family_of(std::string_view arch);

// Every exported tensor of a model with these layouts, params first, each in layout
// order. Throws Error when the arch is unknown or a tensor does not have the shape its
// rule expects (a layout from another family).
std::vector<ExportTensor> export_plan(ModelFamily family,
                                      const std::vector<graph::FlatEntry>& params,
                                      const std::vector<graph::FlatEntry>& buffers);

// Names a reference state dict may hold that carry nothing dtrain trains, skipped when
// a file is imported: batch-norm num_batches_tracked, Hugging Face's non-persistent
// position_ids and attention-mask buffers, and the copies of tied weights
// (lm_head.weight, cls.predictions.decoder.*).
bool ignored_on_import(ModelFamily family, std::string_view name);
// Whether a reference name belongs to a task head, the part a fine-tuning run replaces:
// torchvision's fc.* (ResNet) and heads.* (ViT), Hugging Face BERT's cls.* (masked-LM
// head), bert.pooler.* and classifier.* (sequence classification). model.init_from lets
// these differ between the file and the model (Hugging Face's "newly initialized" and
// "not used" weights); every other tensor must match.
bool is_head_tensor(ModelFamily family, std::string_view name);
// A Hugging Face GPT2Model file names "h.0.ln_1.weight" what GPT2LMHeadModel names
// "transformer.h.0.ln_1.weight": the name the plan uses for `name` (itself otherwise).
std::string canonical_import_name(ModelFamily family, std::string_view name);

// The entries of a checkpoint's "params" or "buffers" meta ([name, dtype, shape] in flat
// order) with the offsets graph::FlatStore assigns.
std::vector<graph::FlatEntry> layout_from_meta(const nlohmann::json& list);

// x -> y for one plan entry: `ours` is the entry's tensor (f32, its own shape), the
// result f32 `t.shape`; and back, writing into `ours`.
Tensor to_reference(const ExportTensor& t, const Tensor& ours);
void from_reference(const ExportTensor& t, const Tensor& reference, Tensor& ours);

}  // namespace dtrain::runtime
