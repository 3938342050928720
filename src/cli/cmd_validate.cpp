// `dtrain validate JOB.yaml [--set key.path=value ...] [--world N] [--no-data]`: loads
// and checks a job file exactly as `dtrain train` would, opens its data as the trainer
// does (both splits, sliced for the data-parallel ranks; --no-data skips it), and prints
// the resolved job as YAML, then, for an architecture with a graph builder, a one-line
// model summary and the data as YAML comments (so the output still loads). Builds the
// graph at batch 1 for that but allocates no parameters and starts no communication;
// warnings go to stderr.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "config/config.h"
#include "core/error.h"
#include "dist/ddp.h"
#include "dist/grid.h"
#include "graph/params.h"
#include "graph/stages.h"
#include "graph/tensor_parallel.h"
#include "models/registry.h"
#include "runtime/data_feed.h"
#include "runtime/estimate.h"
#include "runtime/grad_compression.h"
#include "runtime/param_groups.h"
#include "runtime/pipeline.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"
#include "runtime/trainer.h"

namespace dtrain::cli {
namespace {

struct ValidateArgs {
  std::string job;
  std::vector<std::string> overrides;
  int world = 0;  // 0: from the launcher's environment
  bool no_data = false;
};

// 25557032 -> "25,557,032"
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// "# model: resnet50, 25,557,032 parameters, 8.28 GFLOPs forward per sample"; empty
// for an architecture without a graph builder yet.
std::string model_summary_line(const ModelOptions& model) {
  if (models::find_model(model.arch) == nullptr) return {};
  const models::ModelSummary s = models::summarize(model);
  const double f = s.forward_flops_per_sample;
  const std::string flops =
      f >= 1e9 ? fmt::format("{:.2f} GFLOPs", f / 1e9) : fmt::format("{:.2f} MFLOPs", f / 1e6);
  return fmt::format("# model: {}, {} parameters, {} forward per sample\n", model.arch,
                     with_commas(s.params), flops);
}

// Half GEMMs and convolutions run on tensor cores when their dimensions are multiples
// of 8 elements (16 bytes); otherwise cuBLASLt and cuDNN pick slower kernels or pad.
// The parameters fix every K and N (a linear layer's in and out features, a
// convolution's channels, the hidden size;
// the token count M is the batch's; an embedding table is a gather, except the word
// embedding tied to the output layer, whose rows are the vocabulary). One line
// naming the first few that miss.
std::string tensor_core_line(const std::vector<graph::FlatEntry>& params,
                             std::optional<int> vocab) {
  std::vector<std::string> misses;
  for (const graph::FlatEntry& e : params) {
    const Shape& s = e.spec.shape;
    if (s.rank() < 2) continue;
    bool miss = false;
    if (e.spec.group == graph::ParamGroup::weight) {
      miss = s[0] % 8 != 0 || s[1] % 8 != 0;
    } else if (e.spec.group == graph::ParamGroup::embedding) {  // a gather, unless tied
      miss = s[1] % 8 != 0 || (vocab && s[0] == *vocab && s[0] % 8 != 0);
    }
    if (miss) misses.push_back(fmt::format("{} {}", e.name, s.str()));
  }
  if (misses.empty()) {
    return "# tensor cores: every parameter's GEMM / convolution dimension is a multiple of 8\n";
  }
  std::string list;
  for (size_t i = 0; i < misses.size() && i < 4; ++i) list += (i ? ", " : "") + misses[i];
  if (misses.size() > 4) list += ", ...";
  return fmt::format(
      "# tensor cores: {} parameter(s) with a dimension that is not a multiple of 8 (on CUDA "
      "their half GEMMs or convolutions miss the tensor-core fast path): {}\n",
      misses.size(), list);
}

// "# memory: ..." the estimate's peak per rank (runtime/estimate.h), one line. What the
// peak holds beyond the state is the step's activations, or (a save, model.init_from's
// load) what that moment holds: "more", then.
std::string memory_line(const Job& job) {
  const runtime::MemoryEstimate e = runtime::estimate_memory(job);
  const bool step = e.peak_at.rfind("a checkpoint save", 0) != 0 &&
                    e.peak_at.rfind("reading model.init_from", 0) != 0;
  const double gb = 1e9, above = static_cast<double>(e.peak_bytes - e.state_bytes) / gb;
  return fmt::format(
      "# memory: estimated peak {:.2f} GB per rank (state {:.2f} GB, {}); `dtrain estimate` "
      "prints the table\n",
      static_cast<double>(e.peak_bytes) / gb, static_cast<double>(e.state_bytes) / gb,
      step ? fmt::format("activations {:.2f} GB, at {}", above, e.peak_at)
           : fmt::format("{:.2f} GB more at {}", above, e.peak_at));
}

// optimizer.freeze, layer_decay and groups as the trainer will apply them (a pattern
// that matches nothing is the trainer's exit 2, refused here the same way).
std::string param_group_lines(const Job& job) {
  if (job.optimizer.freeze.empty() && !job.optimizer.layer_decay && job.optimizer.groups.empty())
    return {};
  const models::ModelGraph m = models::build_model(job.model, 1);
  const runtime::ParamGroups groups(job.optimizer, m.graph, job.model.arch);
  std::string out;
  for (const std::string& line : groups.lines()) out += "# " + line + "\n";
  return out;
}

// The dtype policy of a half-precision job as YAML comments: which parameters are
// in which dtype (from the graph the trainer builds), what stays f32, the master
// weights and the loss scaler. Empty for fp32.
std::string precision_lines(const Job& job) {
  const PrecisionOptions& p = job.precision;
  if (p.dtype == PrecisionDType::fp32) return {};
  const DType dt = compute_dtype(p.dtype);
  std::string out;
  if (models::find_model(job.model.arch) != nullptr) {
    const models::ModelGraph m = models::build_model(job.model, 1, graph::DTypePolicy{dt});
    int64_t half = 0, norm = 0;
    for (const graph::FlatEntry& e : m.graph.param_layout())
      (e.spec.dtype == dt ? half : norm) += e.spec.shape.numel();
    out += fmt::format(
        "# precision: {} parameters and activations ({} parameters); f32: normalisation "
        "parameters ({}), buffers, norm statistics, softmax and the loss; GEMMs and "
        "convolutions accumulate in f32\n",
        dtype_name(dt), with_commas(half), with_commas(norm));
    out += tensor_core_line(m.graph.param_layout(), job.model.vocab_size);
  }
  out += fmt::format("# precision: {}\n",
                     p.master_weights ? "fp32 master weights and optimizer state"
                                      : "no master weights: half parameters updated in place");
  const LossScaleOptions& s = p.loss_scale;
  switch (s.mode) {
    case LossScaleMode::none:
      out += "# loss scale: none\n";
      break;
    case LossScaleMode::static_:
      out += fmt::format("# loss scale: static {}; an overflow skips the step\n", s.init);
      break;
    case LossScaleMode::dynamic:
      out += fmt::format(
          "# loss scale: dynamic from {}, x{} after {} clean steps, x{} after {} overflow(s), "
          "within [{}, {}], at the minimum: {}\n",
          s.init, s.growth_factor, s.growth_interval, s.backoff_factor, s.hysteresis, s.min, s.max,
          to_string(s.on_min));
      break;
  }
  return out;
}

// "# compression: ..." what each rank sends per step under compress.method, from the
// trainer's plan (src/compress: which tensors compress, bucket by bucket); `per_stage`:
// the buckets (a pipeline's: each stage's own, added up).
std::string compression_line(const Job& job, const graph::Graph& graph,
                             const graph::FlatStore& layout,
                             const std::vector<std::vector<dist::Bucket>>& per_stage) {
  runtime::CompressionPlanSummary s;
  std::vector<compress::BucketPlan> all;  // every stage's, for the gather warning's ratio
  // Frozen tensors stay dense: the plan's view of the layout, once for every stage.
  const std::vector<compress::ParamInfo> params = runtime::compression_params(
      layout.entries(), runtime::ParamGroups(job.optimizer, graph, job.model.arch));
  for (const std::vector<dist::Bucket>& b : per_stage) {
    const std::vector<compress::BucketPlan> plans =
        compress::plan_compression(job.compress, b, params);
    const runtime::CompressionPlanSummary one =
        runtime::summarize_plan(job.compress, plans, 0, job.parallel.data);
    s.compressed += one.compressed;
    s.per_step.sent += one.per_step.sent;
    s.per_step.dense += one.per_step.dense;
    all.insert(all.end(), plans.begin(), plans.end());
  }
  s.tensors = static_cast<int>(layout.size());
  const std::string warning =
      runtime::gather_warning(job.compress, all, job.parallel.data, job.parallel.zero_stage == 1);
  const std::string choice = runtime::two_phase_note(job.compress, job.parallel.data);
  return fmt::format(
             "# compression: {} on {} of {} parameter tensors{}; {} bytes sent per step per {} "
             "instead of {} ({:.1f}x less), after {} dense step(s)\n",
             to_string(job.compress.method), s.compressed, s.tensors,
             job.compress.method == CompressMethod::powersgd
                 ? std::string()
                 : fmt::format(", exchange {}",
                               to_string(resolve_exchange(job.compress, job.parallel.data))),
             with_commas(static_cast<int64_t>(s.per_step.sent)),
             job.parallel.pipeline > 1 ? "data replica of the model (its stages' together; a tied "
                                         "tensor on each stage that uses it)"
                                       : "rank",
             with_commas(static_cast<int64_t>(s.per_step.dense)), s.ratio(),
             job.compress.warmup_steps) +
         (warning.empty() ? std::string() : "# " + warning + "\n") +
         (choice.empty() ? std::string() : "# " + choice + "\n");
}

// The data-parallel layout as YAML comments: the split of the global batch, the
// gradient buckets (from the model's flat gradient layout, as the trainer cuts
// them), the all-reduce algorithm and where every rank sits. Empty for one rank.
std::string data_parallel_lines(const Job& job, int world) {
  if (world == 1) return {};
  const ParallelOptions& p = job.parallel;
  std::string out =
      fmt::format("# data parallel: {} ranks x {} micro-batch(es) of {} = global batch {}\n",
                  p.data, p.micro_batches, job.data.micro_batch, job.data.global_batch);
  if (models::find_model(job.model.arch) != nullptr) {
    models::ModelGraph m = models::build_model(job.model, 1);
    if (p.tensor > 1)  // tensor rank 0's part: what its buckets (and compression) cut
      graph::split_tensor_parallel(m.graph, graph::placeholder_group(0, p.tensor));
    const graph::FlatStore layout(m.graph.param_layout());
    std::vector<dist::GradRange> ranges;
    for (const graph::FlatEntry& e : layout.entries())
      ranges.push_back({e.offset, e.spec.shape.numel()});
    const int64_t total = layout.buffer_elems(DType::f32);  // as the trainer's, padding included
    const auto bucket_bytes = static_cast<size_t>(job.comm.bucket_mb * 1024.0 * 1024.0);
    // A pipeline stage sums its own parameters' gradients over its data group: its
    // buckets (dist::plan_buckets_of, as the trainer cuts them).
    std::vector<std::vector<dist::Bucket>> per_stage;
    if (p.pipeline > 1) {
      for (const graph::Stage& st : runtime::job_stages(p, m.graph))
        per_stage.push_back(
            dist::plan_buckets_of(ranges, graph::stage_param_indices(m.graph, st), bucket_bytes));
    } else {
      per_stage.push_back(dist::plan_buckets(ranges, total, bucket_bytes));
    }
    const auto sizes_of = [](const std::vector<dist::Bucket>& list) {
      std::string sizes;
      for (size_t b = 0; b < list.size() && b < 8; ++b)
        sizes += fmt::format("{}{:.2f}", b ? ", " : "",
                             static_cast<double>(list[b].end - list[b].begin) * 4.0 / 1e6);
      return sizes + (list.size() > 8 ? ", ... MB" : " MB");
    };
    std::string counts, sizes;
    for (size_t st = 0; st < per_stage.size(); ++st) {
      counts += fmt::format("{}{}", st ? " + " : "", per_stage[st].size());
      sizes +=
          fmt::format("{}{}{}", st ? "; " : "", p.pipeline > 1 ? fmt::format("stage {}: ", st) : "",
                      sizes_of(per_stage[st]));
    }
    if (p.pipeline > 1) counts += " (by stage)";
    // ZeRO reduces each bucket into its owners (the trainer's "reduce to owners").
    const bool zero = p.zero_stage >= 1 && p.data > 1;
    out += fmt::format(
        "# gradient buckets: {}, each closed once it holds {} MB ({}, in launch order), "
        "{} over {}, overlap {}\n",
        counts, job.comm.bucket_mb, sizes,
        zero ? std::string("reduced to their owners")
             : fmt::format("all-reduce {}", to_string(job.comm.allreduce)),
        job.device.is_cuda() ? "nccl" : "mpi", job.comm.overlap ? "on" : "off");
    if (zero) {
      out += fmt::format(
          "# ZeRO-{}: optimizer state{}{} sharded over {} data ranks; checkpoints saved by "
          "shard\n",
          p.zero_stage,
          job.precision.dtype != PrecisionDType::fp32 && job.precision.master_weights
              ? ", fp32 masters"
              : "",
          p.zero_stage >= 3   ? ", gradients, parameters"
          : p.zero_stage == 2 ? ", gradients"
                              : "",
          p.data);
    }
    if (job.compress.method != CompressMethod::none)
      out += compression_line(job, m.graph, layout, per_stage);
    // The graph as the trainer splits it (tensor rank 0's part) and cuts it.
    models::ModelGraph mb = models::build_model(job.model, job.data.micro_batch);
    if (p.tensor > 1) {
      const graph::TensorParallelPlan plan =
          graph::split_tensor_parallel(mb.graph, graph::placeholder_group(0, p.tensor));
      int column = 0, row = 0, heads = 0;
      for (const graph::TensorParallelPlan::Split& sp : plan.splits) {
        column += sp.share.role == graph::TpRole::column;
        row += sp.share.role == graph::TpRole::row;
        heads += sp.share.role == graph::TpRole::heads;
      }
      out += fmt::format(
          "# tensor parallel: {} ranks per group; {} column-split and {} row-split linear "
          "layers, {} attention(s) split by heads{}; the rest replicated\n",
          p.tensor, column, row, heads,
          plan.vocab_total > 0
              ? fmt::format(", the vocabulary split ({} of {} rows on tensor rank 0)",
                            plan.vocab_count, plan.vocab_total)
              : std::string());
    }
    if (p.pipeline > 1) {  // the stages as the trainer cuts them, for one micro-batch
      const std::vector<graph::Stage> stages = runtime::job_stages(p, mb.graph);
      out += fmt::format(
          "# pipeline: {} stages, schedule {}, {} micro-batches per step (idle share in "
          "theory (p - 1) / (m + p - 1) = {:.0f}%)\n",
          p.pipeline, to_string(p.schedule), p.micro_batches,
          100.0 * (p.pipeline - 1) / (p.micro_batches + p.pipeline - 1));
      const std::string lines = graph::format_stages(mb.graph, stages);
      for (size_t at = 0, next; at < lines.size(); at = next + 1) {
        next = lines.find('\n', at);
        if (next == std::string::npos) next = lines.size();
        if (next > at) out += "# " + lines.substr(at, next - at) + "\n";
      }
    }
  }
  const auto places =
      dist::describe_grid(world, dist::degrees_of(p), job.comm.ranks_per_node.value_or(0));
  std::string grid = dist::format_grid(places);
  for (size_t at = 0, next; at < grid.size(); at = next + 1) {
    next = grid.find('\n', at);
    if (next == std::string::npos) next = grid.size();
    out += "# " + grid.substr(at, next - at) + "\n";
  }
  return out;
}

// The job's data opened as the trainer opens it (rank 0's slice of both splits), as one
// comment line; a problem is the Error `dtrain train` would stop with (exit 2).
std::string data_line(const Job& job, bool skip) {
  if (skip) return "# data: not opened (--no-data)\n";
  const auto source =
      runtime::DataSource::open(job, static_cast<uint64_t>(job.run.seed), {0, job.parallel.data});
  const auto train = source->feed(runtime::FeedSplit::train, {}, runtime::FeedContent::all);
  runtime::steps_per_epoch(train->batches_per_epoch(), train->describe(), job);
  source->feed(runtime::FeedSplit::eval, {}, runtime::FeedContent::all);
  return "# data: " + source->describe() + "\n";
}

// model.init_from read and matched against the model as a fresh run reads it (a run that
// finds a checkpoint resumes and never reads it), as one comment line.
std::string init_from_line(const Job& job, bool skip) {
  if (!job.model.init_from) return {};
  const std::filesystem::path resumes =
      runtime::resolve_resume("latest", job.train.checkpoint.dir, "--resume");
  if (!resumes.empty())
    return fmt::format("# init_from: not read: the run resumes from {}\n", resumes.string());
  runtime::require_init_from_supported(job);  // the job alone decides it: --no-data too
  if (skip) return "# init_from: not read (--no-data)\n";
  const models::ModelGraph m = models::build_model(job.model, 1);
  runtime::InitWeights w;
  try {
    w = runtime::load_init_weights(*job.model.init_from, job.model.arch, m.graph.param_layout(),
                                   m.graph.buffer_layout());
  } catch (const Error& e) {
    throw Error("model.init_from: " + e.message(), e.hint());
  }
  return fmt::format("# init_from: {} ({} tensors; {} head tensor(s) from the seed)\n",
                     *job.model.init_from, w.tensors, w.fresh.size());
}

void validate_loaded(const ValidateArgs& args, const Job& job, const config::ValidateContext& ctx);

int run_validate(const ValidateArgs& args) {
  std::vector<std::string> warnings;
  config::ValidateContext ctx;
  ctx.world_size = args.world > 0 ? args.world : world_from_env();
  ctx.warnings = &warnings;
  config::SourceMap where;
  const Job job = config::load_job_file(args.job, args.overrides, ctx, &where);
  for (const auto& w : warnings) std::fprintf(stderr, "dtrain: warning: %s\n", w.c_str());
  config::located_errors(where, [&] { validate_loaded(args, job, ctx); });
  return kExitOk;
}

// What train checks beyond the job file (the layout, the model, the data and init_from
// files), then the resolved job and what it will hold, printed.
void validate_loaded(const ValidateArgs& args, const Job& job, const config::ValidateContext& ctx) {
  runtime::require_trainable(job);  // what train refuses of a layout, refused here too
  if (const int threads = assume_rank_threads(ctx.world_size, job.comm.ranks_per_node.value_or(0)))
    std::fprintf(stderr,
                 "dtrain: note: sized for %d OpenMP thread(s) per rank, as --nproc runs the "
                 "ranks of one machine (OMP_NUM_THREADS sizes for another count)\n",
                 threads);
  const std::string summary = model_summary_line(job.model);
  const std::string groups = param_group_lines(job);
  // The files a run starts from, before any output: exit 2 prints none.
  const std::string data = data_line(job, args.no_data) + init_from_line(job, args.no_data);
  if (!args.no_data) runtime::check_samples_prompt(job);  // needs data.path's tokenizer
  std::fputs(config::dump_job_yaml(job).c_str(), stdout);
  std::fputs(summary.c_str(), stdout);
  if (!summary.empty()) std::fputs(memory_line(job).c_str(), stdout);
  std::fputs(groups.c_str(), stdout);
  std::fputs(data.c_str(), stdout);
  std::fputs(precision_lines(job).c_str(), stdout);
  std::fputs(data_parallel_lines(job, ctx.world_size).c_str(), stdout);
}

}  // namespace

void add_validate(CLI::App& app, Action& action) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* cmd =
      app.add_subcommand("validate", "check a job file and print the resolved job as YAML");
  cmd->add_option("job", args->job, "job file (YAML)")->required();
  cmd->add_option("--set", args->overrides,
                  "override a key, e.g. --set optimizer.lr=0.01 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--world", args->world,
                  "world size to check the parallel layout against "
                  "(default: the launcher's, else 1)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_flag("--no-data", args->no_data,
                "do not read data.path and model.init_from (by default they are read and "
                "checked as dtrain train reads them, which takes as long as train's "
                "start-up)");
  cmd->callback([args, &action] { action = [args] { return run_validate(*args); }; });
}

}  // namespace dtrain::cli
