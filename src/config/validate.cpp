// Checks that need more than one key: run length, batch geometry, the process
// grid against the world size, model shapes against tensor/pipeline parallelism,
// precision, ZeRO, compression, offload and device combinations. Messages point at
// the key that decides (via the SourceMap when there is one). No defaults filled here.
#include <cstdlib>
#include <string>

#include "config/fields.h"
#include "config/parse.h"
#include "core/error.h"

namespace dtrain::config {
namespace {

class Checker {
 public:
  Checker(const Job& job, const ValidateContext& ctx, const SourceMap* where)
      : job(job), ctx(ctx), where(where) {}

  [[noreturn]] void error(std::string_view path, const std::string& msg,
                          std::string hint = {}) const {
    fail(locate(where, path), path, msg, std::move(hint));
  }
  void warn(std::string_view path, const std::string& msg) const {
    if (ctx.warnings == nullptr) return;
    std::string loc = locate(where, path).str();
    ctx.warnings->push_back(fmt::format("{}{}{}: {}", loc, loc.empty() ? "" : ": ", path, msg));
  }
  bool given(std::string_view path) const { return where != nullptr && where->contains(path); }

  const Job& job;
  const ValidateContext& ctx;
  const SourceMap* where;
};

void check_train(const Checker& c) {
  const TrainOptions& t = c.job.train;
  if (t.steps && t.epochs) {
    c.error("train.epochs",
            fmt::format("set either train.steps or train.epochs, not both (steps: {}, epochs: {})",
                        *t.steps, *t.epochs),
            "steps counts optimizer steps; epochs counts passes over the data");
  }
  if (!t.steps && !t.epochs) {
    c.error("train", "set how long to train: train.steps or train.epochs",
            "e.g. train: {steps: 1000}");
  }
  const auto& s = c.job.optimizer.schedule;
  if (t.steps && s.warmup_steps > *t.steps) {
    c.error(
        "optimizer.schedule.warmup_steps",
        fmt::format("{} warm-up steps is more than train.steps ({})", s.warmup_steps, *t.steps));
  }
  const BestOptions& b = t.best;
  if (b.metric != BestMetric::none && !t.eval_every) {
    c.error("train.best.metric",
            fmt::format("{} compares the run's evaluations, and only the last one is run without "
                        "train.eval_every",
                        to_string(b.metric)),
            "set train.eval_every (e.g. 100), or train.best.metric: none");
  }
  if (b.metric != BestMetric::none && t.eval_every && t.steps && *t.eval_every >= *t.steps) {
    c.error("train.eval_every",
            fmt::format("{} evaluates after the last step ({}): train.best.metric {} would "
                        "compare the final evaluation alone",
                        *t.eval_every, *t.steps, to_string(b.metric)),
            fmt::format("set train.eval_every below {}, or train.best.metric: none", *t.steps));
  }
  if (b.metric == BestMetric::none && b.patience > 0) {
    c.error("train.best.patience",
            fmt::format("{} evaluations without improvement of what? train.best.metric is none",
                        b.patience),
            "set train.best.metric: loss (or accuracy), or train.best.patience: 0");
  }
  // Profiled steps are numbered as logged, from 1 (start 0 means the first).
  if (c.job.logging.profile.steps > 0 && t.steps && c.job.logging.profile.start > *t.steps) {
    c.warn("logging.profile.start", fmt::format("starts at step {}, after the last step ({})",
                                                c.job.logging.profile.start, *t.steps));
  }
}

// logging.samples: a GPT-2 on tokenized text (the tokenizer decodes the samples), whose
// training graph holds the whole logits (no pipeline stage or tensor split), one
// forward's rows for the samples, and room in the context for new tokens.
void check_samples(const Checker& c) {
  const SampleOptions& s = c.job.logging.samples;
  if (s.every == 0) return;
  const ArchPreset* arch = find_arch(c.job.model.arch);
  if (arch == nullptr || arch->family != ModelFamily::gpt) {
    c.error("logging.samples.every",
            fmt::format("samples are text from a GPT-2; model.arch is {}", c.job.model.arch),
            "drop logging.samples (a BERT's fill-mask and an image model's classes are "
            "dtrain predict's)");
    return;
  }
  if (c.job.data.dataset != DatasetName::tokens) {
    c.error("logging.samples.every",
            "samples need the tokenizer of tokenized text (data.dataset: tokens) to be read",
            "tokenize a corpus (dtrain data tokenize) and train on it, or drop logging.samples");
  }
  if (c.job.parallel.pipeline > 1 || c.job.parallel.tensor > 1) {
    c.error("logging.samples.every",
            "samples run on the whole model in one graph: not with parallel.pipeline or "
            "parallel.tensor above 1",
            "draw them after training with dtrain generate, which reads any layout's "
            "checkpoint");
  }
  if (s.count > c.job.data.micro_batch) {
    c.error("logging.samples.count",
            fmt::format("{} samples, more than data.micro_batch ({}): they are the rows of one "
                        "forward",
                        s.count, c.job.data.micro_batch),
            fmt::format("set logging.samples.count: {} or less", c.job.data.micro_batch));
  }
  const int64_t context = c.job.model.seq_len.value_or(0);
  if (context > 0 && s.tokens >= context) {
    c.error("logging.samples.tokens",
            fmt::format("{} new tokens do not fit the context of {} (model.seq_len) after "
                        "<|endoftext|>",
                        s.tokens, context),
            fmt::format("set logging.samples.tokens below {}", context));
  }
}

void check_optimizer(const Checker& c) {
  const OptimizerOptions& o = c.job.optimizer;
  if (!o.ema.decay && !o.ema.warmup) {
    c.warn("optimizer.ema.warmup",
           "false has no effect without optimizer.ema.decay: no average of the weights is kept");
  }
  if (!o.freeze.empty() && !c.job.model.init_from) {
    c.warn("optimizer.freeze",
           "without model.init_from the frozen parameters stay at their random initialisation "
           "(unless the run resumes a checkpoint that trained them)");
  }
  if (o.nesterov && o.name != OptimizerName::sgd) {
    c.error("optimizer.nesterov",
            fmt::format("Nesterov momentum is an sgd option, not {}", to_string(o.name)));
  }
  if (o.nesterov && o.momentum == 0) {
    c.error("optimizer.nesterov", "Nesterov momentum needs optimizer.momentum > 0");
  }
  const bool decays =
      o.schedule.name == ScheduleName::cosine || o.schedule.name == ScheduleName::linear;
  if (decays && o.schedule.min_lr >= o.lr) {
    c.error("optimizer.schedule.min_lr",
            fmt::format("{} is not below optimizer.lr ({}); the schedule would not decay",
                        format_real(o.schedule.min_lr), format_real(o.lr)));
  }
}

void check_precision(const Checker& c) {
  const PrecisionOptions& p = c.job.precision;
  const LossScaleOptions& s = p.loss_scale;
  if (p.dtype != PrecisionDType::fp32 && !p.master_weights) {
    if (c.job.optimizer.name == OptimizerName::lamb) {
      c.error("precision.master_weights",
              "false updates the half parameters in place, which LAMB cannot (its trust ratios "
              "read one flat f32 parameter buffer)",
              "keep master_weights: true, or use optimizer.name sgd or adamw");
    }
    if (c.job.optimizer.ema.decay) {
      c.error("optimizer.ema.decay",
              fmt::format("averages the fp32 weights the optimizer steps; with "
                          "precision.master_weights false there are only {} ones, rounded "
                          "every step",
                          to_string(p.dtype)),
              "keep precision.master_weights: true (the average costs an fp32 copy of the "
              "weights either way), or leave optimizer.ema.decay unset");
    }
    // Legal, as the issue and the article frame it: the configuration to avoid.
    c.warn("precision.master_weights",
           fmt::format("false: the {} parameters are updated in place and rounded every step, "
                       "so updates smaller than half a unit in the last place (lr x gradient "
                       "against the weight) are lost; fp32 master weights avoid that",
                       to_string(p.dtype)));
  }
  if (p.dtype == PrecisionDType::fp32 && !p.master_weights) {
    c.warn("precision.master_weights",
           "false has no effect with dtype fp32: the parameters are already the fp32 weights "
           "the optimizer steps");
  }
  if (p.dtype != PrecisionDType::fp16 && s.mode != LossScaleMode::none) {
    // Legal (a power-of-two scale changes no fp32 or bf16 bit unless something
    // overflows, which then skips the step instead of ending the run), but unneeded.
    c.warn("precision.loss_scale.mode",
           fmt::format("{} loss scaling with dtype {}, whose range is fp32's: it only turns an "
                       "overflow into a skipped step",
                       to_string(s.mode), to_string(p.dtype)));
  }
  if (p.dtype == PrecisionDType::fp16 && s.mode == LossScaleMode::none) {
    c.warn("precision.loss_scale.mode",
           "fp16 without loss scaling: small gradients underflow to zero");
  }
  if (p.tf32 && c.job.device.is_cpu()) {
    c.warn("precision.tf32", "TF32 is a CUDA tensor-core mode; device: cpu computes f32 in full");
  }
  if (s.min > s.max) {
    c.error("precision.loss_scale.min",
            fmt::format("{} is above loss_scale.max ({})", format_real(s.min), format_real(s.max)));
  }
  if (s.mode != LossScaleMode::none && (s.init < s.min || s.init > s.max)) {
    c.error("precision.loss_scale.init",
            fmt::format("{} is outside [loss_scale.min, loss_scale.max] = [{}, {}]",
                        format_real(s.init), format_real(s.min), format_real(s.max)));
  }
}

void check_grid(const Checker& c) {
  const ParallelOptions& p = c.job.parallel;
  const int64_t product = int64_t{p.tensor} * p.pipeline * p.data;
  if (product != c.ctx.world_size) {
    c.error(c.given("parallel.data") ? "parallel.data" : "parallel",
            fmt::format("tensor ({}) x pipeline ({}) x data ({}) = {}, but the world size is {}",
                        p.tensor, p.pipeline, p.data, product, c.ctx.world_size),
            "the product must equal the number of ranks (dtrain train --nproc, mpirun -np, "
            "srun -n; --world for validate, estimate); "
            "leave parallel.data out to derive it");
  }
  if (p.zero_stage > 0 && p.data == 1) {
    c.warn("parallel.zero_stage",
           fmt::format("ZeRO-{} with one data-parallel rank shards nothing", p.zero_stage));
  }
  if (p.zero_stage >= 2 && p.pipeline > 1) {
    c.error("parallel.zero_stage",
            fmt::format("ZeRO-{} does not combine with pipeline parallelism", p.zero_stage),
            "pipeline stages accumulate gradients over micro-batches; use zero_stage 0 or 1");
  }
  if (p.pipeline_blocks && static_cast<int>(p.pipeline_blocks->size()) != p.pipeline) {
    c.error("parallel.pipeline_blocks",
            fmt::format("{} entries for parallel.pipeline = {} stages", p.pipeline_blocks->size(),
                        p.pipeline),
            "give one block count per stage, or leave the key out to balance by FLOPs");
  }
  if (p.pipeline > 1 && p.micro_batches < p.pipeline) {
    c.warn("parallel.micro_batches",
           fmt::format("{} micro-batches for {} pipeline stages leaves stages idle",
                       p.micro_batches, p.pipeline));
  }
}

void check_batches(const Checker& c) {
  const DataOptions& d = c.job.data;
  const ParallelOptions& p = c.job.parallel;
  const int64_t per_step = d.micro_batch * p.data;
  if (!c.given("data.micro_batch") && !c.given("parallel.micro_batches") &&
      d.global_batch % p.data != 0) {
    c.error("data.global_batch",
            fmt::format("{} is not divisible by the {} data-parallel ranks (parallel.data)",
                        d.global_batch, p.data),
            "every data-parallel rank takes an equal share of the global batch");
  }
  if (c.given("parallel.micro_batches") && !c.given("data.micro_batch") &&
      d.global_batch % (int64_t{p.data} * p.micro_batches) != 0) {
    c.error("data.global_batch",
            fmt::format("{} is not divisible by parallel.data ({}) x parallel.micro_batches ({})",
                        d.global_batch, p.data, p.micro_batches));
  }
  if (d.global_batch % per_step != 0) {
    c.error("data.global_batch",
            fmt::format("{} is not divisible by data.micro_batch ({}) x parallel.data ({}) = {}",
                        d.global_batch, d.micro_batch, p.data, per_step),
            "global_batch = micro_batch x data-parallel ranks x accumulation micro-batches");
  }
  if (d.global_batch / per_step != p.micro_batches) {
    c.error("parallel.micro_batches",
            fmt::format("{} does not match data.global_batch / (data.micro_batch x parallel.data) "
                        "= {} / {} = {}",
                        p.micro_batches, d.global_batch, per_step, d.global_batch / per_step),
            "set only one of data.micro_batch and parallel.micro_batches");
  }
}

void check_transformer(const Checker& c) {
  const ModelOptions& m = c.job.model;
  const ParallelOptions& p = c.job.parallel;
  if (!m.heads || !m.hidden) return;
  if (*m.hidden % *m.heads != 0) {
    c.error("model.hidden",
            fmt::format("{} is not divisible by model.heads ({})", *m.hidden, *m.heads),
            "each attention head gets hidden / heads dimensions");
  }
  if (*m.heads % p.tensor != 0) {
    c.error(
        "model.heads",
        fmt::format("{} heads cannot be split over parallel.tensor = {} ranks", *m.heads, p.tensor),
        "tensor parallelism gives each rank heads / tensor whole heads");
  }
  if (m.ffn && *m.ffn % p.tensor != 0) {
    c.error("model.ffn",
            fmt::format("{} is not divisible by parallel.tensor ({})", *m.ffn, p.tensor));
  }
  if (m.layers && *m.layers < p.pipeline) {
    c.error("parallel.pipeline",
            fmt::format("{} pipeline stages for {} layers; every stage needs a layer", p.pipeline,
                        *m.layers));
  }
  if (m.patch_size && m.image_size && *m.image_size % *m.patch_size != 0) {
    c.error("model.image_size", fmt::format("{} is not divisible by model.patch_size ({})",
                                            *m.image_size, *m.patch_size));
  }
}

void check_model(const Checker& c) {
  // The loss takes the smoothing in f32: a value that rounds to 1 would leave no target.
  if (static_cast<float>(c.job.model.label_smoothing) >= 1.0f) {
    c.error("model.label_smoothing",
            fmt::format("{} is 1 in single precision, where the loss computes it",
                        format_real(c.job.model.label_smoothing)),
            "use a value below 0.9999999, e.g. 0.1");
  }
  const ArchPreset* arch = find_arch(c.job.model.arch);
  if (arch == nullptr)
    c.error("model.arch", fmt::format("unknown architecture \"{}\"", c.job.model.arch));
  if (arch->family == ModelFamily::cnn && c.job.parallel.tensor > 1) {
    c.error(
        "parallel.tensor",
        fmt::format("tensor parallelism splits attention heads and MLPs; {} is a CNN", arch->name),
        "use data or pipeline parallelism for CNNs");
  }
  const ModelOptions& m = c.job.model;
  if (arch->family == ModelFamily::bert && m.num_classes) {  // a sequence classifier
    if (*m.num_classes < 2) {
      c.error("model.num_classes",
              fmt::format("{}: a classifier needs at least two classes", *m.num_classes),
              "leave num_classes out to pretrain with the masked-LM objective");
    }
    if (m.seq_len && *m.seq_len < 3) {
      c.error(
          "model.seq_len",
          fmt::format("{}; a classifier's row holds [CLS] and [SEP] around its text", *m.seq_len),
          "set model.seq_len to at least 3 (texts longer than seq_len - 2 tokens are cut)");
    }
    // (A resolved job, as dtrain writes it, holds the default: that one is not refused.)
    if (c.given("data.mlm_probability") &&
        c.job.data.mlm_probability != DataOptions{}.mlm_probability) {
      c.error("data.mlm_probability", "not used by a classifier (model.num_classes is set)",
              "remove the key, or model.num_classes to pretrain with the masked-LM objective");
    }
  }
  check_transformer(c);
}

void check_data(const Checker& c) {
  const DataOptions& d = c.job.data;
  const ModelOptions& m = c.job.model;
  const ArchPreset* arch = find_arch(m.arch);
  if (d.dataset != DatasetName::synthetic && !d.path) {
    c.error("data.path", fmt::format("dataset {} needs data.path", to_string(d.dataset)),
            "point it at the directory holding the dataset files");
  }
  const bool language = is_language_model(arch->family);
  if (d.dataset == DatasetName::tokens && !language) {
    c.error("data.dataset", fmt::format("token shards feed language models, but {} is a {}", m.arch,
                                        to_string(arch->family)));
  }
  if (d.unreadable == UnreadableAction::skip && d.dataset != DatasetName::image_folder) {
    c.error("data.unreadable",
            fmt::format("skip, but {} is read whole at start-up, where a damaged file stops "
                        "the run before any step: only image-folder decodes its files mid-run",
                        to_string(d.dataset)),
            "remove the key (or set it to stop)");
  }
  if (d.unreadable == UnreadableAction::skip && c.job.parallel.pipeline > 1) {
    c.error("data.unreadable",
            fmt::format("skip with parallel.pipeline = {}: the later stages read the labels "
                        "only and cannot know which image the first stage left out",
                        c.job.parallel.pipeline),
            "set data.unreadable: stop (a damaged file then stops the run after saving)");
  }
  if (d.holdout && d.dataset != DatasetName::image_folder) {
    c.error("data.holdout",
            fmt::format("{} has its own test split: only image-folder holds out part of its "
                        "training images",
                        to_string(d.dataset)),
            "remove the key");
  }
  if (d.dataset != DatasetName::image_folder) {
    for (const auto& [key, given] : {std::pair{"data.augment.scale", d.augment.scale.has_value()},
                                     std::pair{"data.augment.ratio", d.augment.ratio.has_value()},
                                     std::pair{"data.center_crop", d.center_crop.has_value()}}) {
      if (given) {
        c.error(key,
                fmt::format("{}'s images have one size: only image-folder crops at random "
                            "sizes and centre-crops its evaluation",
                            to_string(d.dataset)),
                "remove the key (data.augment.crop_padding crops a fixed-size set)");
      }
    }
  } else if (language) {
    c.error("data.dataset", fmt::format("image-folder holds images, but {} is a {}", m.arch,
                                        to_string(arch->family)));
  } else if (m.in_channels && *m.in_channels != 1 && *m.in_channels != 3) {
    c.error("model.in_channels",
            fmt::format("{}, but image files are read as gray (1) or RGB (3)", *m.in_channels),
            "set model.in_channels: 3 (or 1)");
  }
  const auto shape = dataset_shape(d.dataset);
  if (shape && language) {
    c.error("data.dataset", fmt::format("{} holds images, but {} is a {}", to_string(d.dataset),
                                        m.arch, to_string(arch->family)));
  }
  if (!shape) return;
  if (m.in_channels && *m.in_channels != shape->channels) {
    c.error("model.in_channels", fmt::format("{}, but {} images have {} channel(s)", *m.in_channels,
                                             to_string(d.dataset), shape->channels));
  }
  if (m.image_size && *m.image_size != shape->image_size) {
    c.error("model.image_size",
            fmt::format("{}, but {} images are {}x{}", *m.image_size, to_string(d.dataset),
                        shape->image_size, shape->image_size));
  }
  if (m.num_classes && *m.num_classes < shape->classes) {
    c.error("model.num_classes", fmt::format("{}, but {} has {} classes", *m.num_classes,
                                             to_string(d.dataset), shape->classes));
  }
}

void check_comm(const Checker& c) {
  const CommOptions& comm = c.job.comm;
  if (comm.backend == CommBackend::nccl && c.job.device.is_cpu()) {
    c.error("comm.backend", "nccl moves device buffers, but device is cpu",
            "use backend auto or mpi on cpu");
  }
  if (comm.backend == CommBackend::mpi && c.job.device.is_cuda()) {
    c.error("comm.backend",
            "mpi moves host buffers, but device is cuda (gradients on the GPU "
            "travel over NCCL)",
            "use backend auto or nccl with device cuda");
  }
  if (comm.ranks_per_node && c.ctx.world_size % *comm.ranks_per_node != 0) {
    c.error("comm.ranks_per_node", fmt::format("{} does not divide the world size {}",
                                               *comm.ranks_per_node, c.ctx.world_size));
  }
}

void check_compress(const Checker& c) {
  const CompressOptions& k = c.job.compress;
  if (k.exchange != CompressExchange::auto_ && k.method != CompressMethod::topk &&
      k.method != CompressMethod::onebit) {
    c.error("compress.exchange",
            fmt::format("{} is how top-k and 1-bit exchange a bucket, and compress.method is {}",
                        to_string(k.exchange), to_string(k.method)),
            k.method == CompressMethod::powersgd
                ? "remove compress.exchange: powersgd all-reduces its factors"
                : "set compress.method to topk or onebit, or remove compress.exchange");
  }
  if (k.method == CompressMethod::none) return;
  const std::string method(to_string(k.method));
  if (c.job.parallel.zero_stage >= 2) {
    c.error("compress.method",
            fmt::format("{} compresses an all-reduce; ZeRO-{} reduces every micro-batch's "
                        "gradients into their owners and keeps no whole gradient, while error "
                        "feedback keeps a residual as large as the compressed gradient on every "
                        "rank",
                        method, c.job.parallel.zero_stage),
            "use zero_stage 0 or 1 with compression (ZeRO-1 shards the optimizer state and "
            "composes with it)");
  }
  if (c.job.parallel.data == 1) {
    c.error("compress.method",
            fmt::format("{} compresses what ranks exchange, and parallel.data is 1", method),
            "set parallel.data (and --nproc) to 2 or more, or remove compress.method");
  }
}

void check_memory(const Checker& c) {
  const MemoryOptions& mem = c.job.memory;
  if (mem.offload.params && c.job.parallel.zero_stage != 3) {
    c.error("memory.offload.params",
            fmt::format("parameter offload needs parallel.zero_stage 3, got {}",
                        c.job.parallel.zero_stage));
  }
  // Optimizer offload moves the fp32 masters and the optimizer state from the GPU to
  // pinned host memory (with or without ZeRO); on the CPU both already live there.
  // DTRAIN_TEST_OFFLOAD_ON_CPU=1 lets the tests run the offload path on the CPU, where
  // host and device memory are the same (the copies are then plain memcpys). Not a
  // user feature.
  const char* test_cpu = std::getenv("DTRAIN_TEST_OFFLOAD_ON_CPU");
  const bool allow_cpu = test_cpu != nullptr && std::string(test_cpu) == "1";
  if (mem.offload.params && c.job.device.is_cpu() && !allow_cpu) {
    c.error("memory.offload.params",
            "parameter offload moves this rank's shard of the parameters from GPU memory to "
            "host memory; with device: cpu it already is in host memory, so the key would "
            "change nothing",
            "remove memory.offload.params, or set device: cuda");
  }
  if (mem.offload.optimizer && c.job.device.is_cpu() && !allow_cpu) {
    c.error("memory.offload.optimizer",
            "optimizer offload moves the optimizer state from GPU memory to host memory; with "
            "device: cpu it already is in host memory, so the key would change nothing",
            "remove memory.offload.optimizer, or set device: cuda");
  }
  // The optimizer step writes the parameter shard: with the shard in host memory the
  // step runs there too (ZeRO-Infinity's CPU variant, without NVMe).
  if (mem.offload.params && !mem.offload.optimizer) {
    c.error("memory.offload.params",
            "parameter offload needs memory.offload.optimizer: true (the optimizer step writes "
            "the offloaded parameters, so it runs in host memory too)",
            "add memory.offload.optimizer: true");
  }
}

}  // namespace

void validate_job(const Job& job, const ValidateContext& ctx, const SourceMap* where) {
  if (ctx.world_size < 1)
    throw Error(fmt::format("world size {} must be at least 1", ctx.world_size));
  const Checker c(job, ctx, where);
  if (ctx.model_only) {  // neither the training nor its layout runs
    check_precision(c);
    check_model(c);
    check_data(c);
    return;
  }
  check_train(c);
  check_optimizer(c);
  check_precision(c);
  check_model(c);
  check_grid(c);
  check_batches(c);
  check_data(c);
  check_comm(c);
  check_compress(c);
  check_memory(c);
  check_samples(c);
}

}  // namespace dtrain::config
