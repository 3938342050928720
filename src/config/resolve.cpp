// Derived defaults: values the job may leave out because they follow from other
// keys (model presets and the dataset's image shape, the loss-scale mode from the
// dtype, the data-parallel size from the world size, micro-batching from the
// batch sizes, the checkpoint directory from run.output_dir, the dataset's packaged
// path and augmentation defaults). Checks stay in validate.cpp.
#include <fmt/ranges.h>

#include "config/fields.h"
#include "config/parse.h"
#include "config/suggest.h"
#include "core/error.h"

namespace dtrain::config {
namespace {

template <class T>
void take_preset(std::optional<T>& value, const std::optional<T>& preset, std::string_view key,
                 const ArchPreset& arch, const SourceMap& where) {
  if (value && !preset) {
    const std::string path = fmt::format("model.{}", key);
    fail(locate(&where, path), path,
         fmt::format("not used by {} (a {})", arch.name, to_string(arch.family)), "remove the key");
  }
  if (!value) value = preset;
}

void resolve_model(Job& job, const SourceMap& where) {
  ModelOptions& m = job.model;
  const ArchPreset* arch = find_arch(m.arch);
  if (arch == nullptr) {
    std::vector<std::string> names;
    for (const auto& a : kArchPresets) names.emplace_back(a.name);
    fail(locate(&where, "model.arch"), "model.arch",
         fmt::format("unknown architecture \"{}\"{}", m.arch, did_you_mean(m.arch, names)),
         fmt::format("built-in architectures: {}", fmt::join(names, ", ")));
  }
  ModelOptions p = preset_options(*arch);
  if (auto shape = dataset_shape(job.data.dataset); shape && p.image_size) {
    p.image_size = shape->image_size;
    p.in_channels = shape->channels;
    p.num_classes = shape->classes;
  }
  // BERT has no class count of its own: num_classes asks for the classifier head.
  if (arch->family != ModelFamily::bert)
    take_preset(m.num_classes, p.num_classes, "num_classes", *arch, where);
  take_preset(m.image_size, p.image_size, "image_size", *arch, where);
  take_preset(m.in_channels, p.in_channels, "in_channels", *arch, where);
  take_preset(m.stem, p.stem, "stem", *arch, where);
  take_preset(m.width, p.width, "width", *arch, where);
  take_preset(m.zero_init_residual, p.zero_init_residual, "zero_init_residual", *arch, where);
  take_preset(m.patch_size, p.patch_size, "patch_size", *arch, where);
  take_preset(m.seq_len, p.seq_len, "seq_len", *arch, where);
  take_preset(m.max_positions, p.max_positions, "max_positions", *arch, where);
  take_preset(m.vocab_size, p.vocab_size, "vocab_size", *arch, where);
  take_preset(m.layers, p.layers, "layers", *arch, where);
  take_preset(m.hidden, p.hidden, "hidden", *arch, where);
  take_preset(m.heads, p.heads, "heads", *arch, where);
  if (!m.ffn && m.hidden && where.contains("model.hidden")) p.ffn = 4 * *m.hidden;
  take_preset(m.ffn, p.ffn, "ffn", *arch, where);
  take_preset(m.dropout, p.dropout, "dropout", *arch, where);
  // BERT's masked-LM head predicts the loader's fixed number of positions.
  if (arch->family == ModelFamily::bert && !m.num_classes && m.seq_len) {
    m.mlm_predictions =
        static_cast<int>(masked_lm_predictions(*m.seq_len, job.data.mlm_probability));
  }
}

void resolve_data_parallel(Job& job, const SourceMap& where, int world) {
  ParallelOptions& par = job.parallel;
  if (where.contains("parallel.data") && par.data != 0) return;  // 0: `auto`
  const int64_t model_ranks = int64_t{par.tensor} * par.pipeline;
  if (world % model_ranks != 0) {
    fail(locate(&where, "parallel"), "parallel",
         fmt::format("tensor ({}) x pipeline ({}) = {} does not divide the world size {}",
                     par.tensor, par.pipeline, model_ranks, world),
         "the world is split into pipeline x data x tensor ranks; choose sizes whose product "
         "divides it");
  }
  par.data = static_cast<int>(world / model_ranks);
}

void resolve_dataset(DataOptions& d) {
  if (!d.path) {
    if (auto dir = default_dataset_path(d.dataset)) d.path = std::string(*dir);
  }
  const AugmentOptions defaults = default_augment(d.dataset);
  if (!d.augment.crop_padding) d.augment.crop_padding = defaults.crop_padding;
  if (!d.augment.flip) d.augment.flip = defaults.flip;
  if (!d.augment.scale) d.augment.scale = defaults.scale;
  if (!d.augment.ratio) d.augment.ratio = defaults.ratio;
  if (!d.center_crop && d.dataset == DatasetName::image_folder) d.center_crop = kDefaultCenterCrop;
}

void resolve_batches(Job& job, const SourceMap& where) {
  DataOptions& d = job.data;
  ParallelOptions& par = job.parallel;
  const bool micro = where.contains("data.micro_batch");
  const bool steps = where.contains("parallel.micro_batches");
  if (!micro) {
    const int64_t per_rank = int64_t{par.data} * (steps ? par.micro_batches : 1);
    if (d.global_batch % per_rank == 0) d.micro_batch = d.global_batch / per_rank;
  }
  if (!steps) {
    const int64_t per_step = d.micro_batch * par.data;
    if (d.global_batch % per_step == 0 && d.global_batch / per_step <= INT32_MAX)
      par.micro_batches = static_cast<int>(d.global_batch / per_step);
  }
}

}  // namespace

SourceLoc locate(const SourceMap* where, std::string_view path) {
  if (where == nullptr) return {};
  for (std::string_view p = path;;) {
    if (auto it = where->find(p); it != where->end()) return it->second;
    if (p.empty()) return {};
    const size_t dot = p.rfind('.');
    p = dot == std::string_view::npos ? std::string_view() : p.substr(0, dot);
  }
}

void resolve_job(Job& job, const SourceMap& where, const ValidateContext& ctx) {
  resolve_model(job, where);
  if (!where.contains("precision.loss_scale.mode")) {
    job.precision.loss_scale.mode =
        job.precision.dtype == PrecisionDType::fp16 ? LossScaleMode::dynamic : LossScaleMode::none;
  }
  resolve_data_parallel(job, where, ctx.world_size);
  resolve_batches(job, where);
  resolve_dataset(job.data);
  if (!where.contains("train.checkpoint.dir")) {
    job.train.checkpoint.dir = job.run.output_dir + "/checkpoints";
  }
}

}  // namespace dtrain::config
