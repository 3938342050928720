// See estimate.h. Mirrors what TrainSession allocates (trainer.cpp, master_weights.cpp,
// the optimizers, data_feed.cpp); tests/train/test_estimate.cpp holds it to the
// allocator's measured peak.
#include "runtime/estimate.h"
#include "runtime/param_groups.h"
#include "runtime/safetensors.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "compress/compressor.h"
#include "core/allocator.h"
#include "core/block_pool.h"
#include "data/options.h"
#include "dist/ddp.h"
#include "graph/stages.h"
#include "graph/tensor_parallel.h"
#include "kernels/device_info.h"
#include "models/registry.h"
#include "optim/optimizer.h"
#include "precision/options.h"
#include "runtime/grad_compression.h"
#include "runtime/pipeline.h"
#include "runtime/tensor_parallel.h"
#include "runtime/zero.h"

namespace dtrain::runtime {

std::string format_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} kB", b / 1e3);
}

std::string format_seconds(double s) {
  if (s == 0) return "0 s";
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

namespace {

constexpr const char* kInitFromPeak =
    "reading model.init_from (a tensor at a time, with its f32 widening and layout copy)";

std::string where(const graph::Graph& g, const graph::ActivationPeak& p) {
  if (p.node == -2) return "the accuracy count (half logits widened to f32)";
  if (p.node == -3) return "the compressed gradient exchange after backward";
  if (p.node == -4) return "the step's gather of the stepped parameters (ZeRO)";
  if (p.node < 0) return "nowhere";
  return fmt::format("{} of {}", p.phase == graph::Phase::forward ? "forward" : "backward",
                     g.nodes()[static_cast<size_t>(p.node)].name);
}

}  // namespace

int blocks_per_segment(const Job& job, const graph::Graph& graph) {
  switch (job.memory.checkpointing) {
    case ActivationCheckpointing::none:
      return 0;
    case ActivationCheckpointing::block:
      return 1;
    case ActivationCheckpointing::every_k:
      return job.memory.every_k;
    case ActivationCheckpointing::sqrt:
      return std::max(1, static_cast<int>(std::ceil(std::sqrt(graph.num_blocks()))));
  }
  return 0;
}

namespace {

// Gradient compression on one rank (a pipeline: per stage): what it keeps and its
// buckets' exchanges.
struct StageCompression {
  size_t residual = 0, q = 0, server = 0;  // bytes, rounded
  double bus = 0;                          // data traffic per step
  graph::GradBuckets buckets;  // the exchanges, as the buckets' last gradients are ready
  size_t exchange_after = 0;   // overlap off: the exchanges after backward, in sequence
                               // (graph::ExchangeSequence; on: the plan's
                               // ActivationPeak::exchange_after)
};

// A pipeline's stages (runtime/pipeline.h): stage s replays its nodes for one micro-batch
// (graph::StageRange); with K of them in flight (GPipe: every micro-batch; 1F1B: P - s),
// K - 1 hold what a forward leaves for its backward while one runs its own peak, and
// each of the step's micro-batch slots keeps the copies of its inputs. The worst stage's becomes
// the estimate's training activations; its evaluation (one micro-batch, slot 0) runs
// beside the other slots' input copies.
// stages: the job's; stage_state[s]: stage s's state bytes (the masters and optimizer state of its
// span); compression: per stage (empty: none), whose exchanges run in the stage's last
// micro-batch's backward. The estimate's peak becomes the highest stage's.
void pipeline_activations(const Job& job, const models::ModelGraph& m,
                          const graph::RoundBytes& round, const std::vector<char>& eval_pins,
                          const std::vector<graph::Stage>& stages,
                          const std::vector<size_t>& stage_state,
                          const std::vector<StageCompression>& compression,
                          const graph::BackwardSet& frozen, MemoryEstimate& e) {
  const graph::Graph& g = m.graph;
  const int P = job.parallel.pipeline, micro = job.parallel.micro_batches;
  std::vector<int> cuts;
  for (size_t k = 1; k < stages.size(); ++k) cuts.push_back(stages[k].first_block);
  const auto bytes = [&](graph::ValueId v) {
    const graph::TensorSpec& s = g.value(v).spec;
    return round(static_cast<size_t>(s.shape.numel()) * dtype_size(s.dtype));
  };
  const size_t copies = bytes(m.input) + bytes(m.labels);  // per slot (TrainSession)
  graph::ActivationPeak worst_train, worst_eval;
  for (int s = 0; s < P; ++s) {
    graph::StageRange r;
    r.begin = stages[static_cast<size_t>(s)].begin;
    r.end = stages[static_cast<size_t>(s)].end;
    r.receives = stages[static_cast<size_t>(s)].receives;
    if (s + 1 < P) {
      for (graph::ValueId v : stages[static_cast<size_t>(s) + 1].receives)
        if (g.value(v).requires_grad) r.grad_seeds.push_back(v);
    }
    const graph::ActivationPeak one =
        graph::plan_activations(g, graph::Mode::train, {}, round, blocks_per_segment(job, g),
                                nullptr, nullptr, &r, cuts, &frozen);
    graph::ActivationPeak eval =
        graph::plan_activations(g, graph::Mode::eval, eval_pins, round, 0, nullptr, nullptr, &r);
    const int k = job.parallel.schedule == PipelineSchedule::gpipe ? micro : std::min(P - s, micro);
    graph::ActivationPeak train = one;
    // Every slot keeps its micro-batch's input copies until the next step replaces them;
    // an evaluation sets slot 0's inputs from the feed itself.
    train.peak = static_cast<size_t>(k - 1) * one.held_after_forward + one.peak +
                 static_cast<size_t>(micro) * copies;
    if (!compression.empty()) {
      // The stage's exchanges run in its last micro-batch's backward (after it with
      // overlap off), when it holds that micro-batch's activations alone and every
      // slot's input copies.
      const StageCompression& c = compression[static_cast<size_t>(s)];
      const graph::ActivationPeak last =
          graph::plan_activations(g, graph::Mode::train, {}, round, blocks_per_segment(job, g),
                                  &c.buckets, nullptr, &r, cuts, &frozen);
      const size_t during = last.peak,
                   after = last.at_end + std::max(c.exchange_after, last.exchange_after);
      const size_t at = std::max(during, after) + static_cast<size_t>(micro) * copies;
      if (at > train.peak) {
        train.peak = at;
        train.node = during >= after ? last.node : -3;
        train.phase = during >= after ? last.phase : graph::Phase::backward;
      }
    }
    eval.peak += static_cast<size_t>(micro - 1) * copies;
    MemoryEstimate::Stage st;
    st.stage = s;
    st.in_flight = k;
    st.train = train.peak;
    st.eval = eval.peak;
    st.peak = stage_state[static_cast<size_t>(s)] + std::max(st.train, st.eval);
    if (job.device.is_cpu()) st.peak += e.host_bytes;
    st.at = train.node >= 0    ? g.nodes()[static_cast<size_t>(train.node)].name
            : train.node == -3 ? "the compressed gradient exchange after backward"
                               : "";
    e.stages.push_back(st);
    if (train.peak > worst_train.peak) worst_train = train;
    if (eval.peak > worst_eval.peak) worst_eval = eval;
  }
  e.train = worst_train;
  e.eval = worst_eval;
  e.caveat = fmt::format(
      "parallel.pipeline = {}: the activations are the worst stage's (its nodes for up to {} "
      "micro-batch(es) at once, {}); each stage holds the parameters its nodes use and their "
      "gradients, and the masters and optimizer state of its own span",
      P, job.parallel.schedule == PipelineSchedule::gpipe ? micro : std::min(P, micro),
      to_string(job.parallel.schedule));
}

// MemoryEstimate::Comm for the (split) graph `g`: the collectives the split ops make
// (graph/tensor_parallel.h) over the worst pipeline stage's nodes, and that stage's
// exchanges. sent_bytes: what the gradient buckets hold (gradient_buckets), per stage.
MemoryEstimate::Comm communication(const Job& job, const graph::Graph& g,
                                   const graph::TensorParallelPlan& plan,
                                   const std::vector<double>& sent_bytes) {
  MemoryEstimate::Comm c;
  const ParallelOptions& p = job.parallel;
  const double micro = p.micro_batches;
  const auto ring = [](int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; };
  c.data = *std::max_element(sent_bytes.begin(), sent_bytes.end()) * ring(p.data);
  const auto bytes = [&](graph::ValueId v) {
    const graph::TensorSpec& s = g.value(v).spec;
    return static_cast<double>(s.shape.numel()) * static_cast<double>(dtype_size(s.dtype));
  };
  std::vector<graph::Stage> stages;
  if (p.pipeline > 1) {
    stages = job_stages(p, g);
  } else {
    stages.push_back({});
    stages[0].end = static_cast<int>(g.nodes().size());
  }
  const bool recompute = blocks_per_segment(job, g) > 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    double tensor = 0;
    int64_t calls = 0;
    for (const graph::TensorParallelPlan::Split& split : plan.splits) {
      if (split.node < stages[s].begin || split.node >= stages[s].end) continue;
      const graph::Node& n = g.nodes()[static_cast<size_t>(split.node)];
      const int again = recompute && n.block >= 0 ? 2 : 1;  // checkpointing forwards twice
      const std::string_view kind = n.op->kind();
      if (split.share.role == graph::TpRole::row || kind == "token_embedding") {
        tensor += again * bytes(n.outputs[0]);
        calls += again;
      } else if (kind == "softmax_cross_entropy") {  // row maxima, then three sums per row
        tensor += again * 16.0 *
                  static_cast<double>(g.value(n.inputs[0]).spec.shape.numel() /
                                      g.value(n.inputs[0]).spec.shape[-1]);
        calls += 2 * again;
      } else if ((split.share.role == graph::TpRole::column ||
                  split.share.role == graph::TpRole::vocab) &&
                 kind != "token_embedding" && g.value(n.inputs[0]).requires_grad) {
        tensor += bytes(n.inputs[0]);  // backward: the input gradient's parts summed
        ++calls;
      }
    }
    c.tensor = std::max(c.tensor, tensor * micro * ring(p.tensor));
    c.tensor_calls = std::max(c.tensor_calls, calls * p.micro_batches);
    if (p.pipeline > 1) {
      double moved = 0;  // activations in, their gradients back; the next stage's the same
      for (graph::ValueId v : stages[s].receives)
        moved += bytes(v) * (g.value(v).requires_grad ? 2 : 1);
      if (s + 1 < stages.size()) {
        for (graph::ValueId v : stages[s + 1].receives)
          moved += bytes(v) * (g.value(v).requires_grad ? 2 : 1);
      }
      c.pipeline = std::max(c.pipeline, moved * micro);
    }
  }
  if (p.tensor == 1) c.tensor_calls = 0;
  return c;
}

}  // namespace

MemoryEstimate estimate_memory(const Job& job, const EstimateOptions& options) {
  // Rounded as the allocator that will hold them counts: the host's caching allocator,
  // or the GPU's block pool.
  const graph::RoundBytes round =
      !job.memory.pool && job.device.is_cpu()
          ? graph::RoundBytes([](size_t b) { return b; })  // memory.pool: false, no classes
      : job.device.is_cuda()
          ? graph::RoundBytes([](size_t b) { return BlockPool::size_class(b); })
          : graph::RoundBytes([](size_t b) { return CachingAllocator::size_class(b); });
  const int64_t batch = job.data.micro_batch;
  graph::DTypePolicy policy;
  policy.compute = compute_dtype(job.precision.dtype);
  models::ModelGraph m = models::build_model(job.model, batch, policy);
  // Tensor parallelism: rank 0's part (it holds the largest share of a vocabulary).
  graph::TensorParallelPlan tp_plan;
  int64_t whole_elems = 0;  // the one-rank model's fp32 layout (a tensor-parallel save's)
  std::vector<graph::FlatEntry> whole_entries;
  if (job.parallel.tensor > 1) {
    whole_entries = whole_f32_layout(m.graph);
    whole_elems = graph::FlatStore(whole_entries).buffer_elems(DType::f32);
    tp_plan =
        graph::split_tensor_parallel(m.graph, graph::placeholder_group(0, job.parallel.tensor));
  }
  const graph::Graph& g = m.graph;
  MemoryEstimate e;
  auto add = [&](std::string kind, size_t bytes, std::string note) {
    if (bytes > 0) e.state.push_back({std::move(kind), bytes, std::move(note)});
  };
  const graph::ExecutorBytes ex = graph::executor_bytes(g, job.device, round);
  size_t f32_layout = ex.grads;  // the fp32 layout: masters and optimizer state alike
  // ZeRO: masters and optimizer state (stage 2: the gradients too, stage 3: the
  // parameters too) hold this rank's shard of the layout; the last rank's is the
  // largest (runtime/zero.h: the tail).
  const int world = job.parallel.data;
  const bool sharded = job.parallel.zero_stage >= 1 && world > 1;
  const bool zero2 = job.parallel.zero_stage >= 2 && world > 1;
  const bool zero3 = job.parallel.zero_stage >= 3 && world > 1;
  std::vector<graph::FlatEntry> wide = g.param_layout();
  for (graph::FlatEntry& e : wide) e.spec.dtype = DType::f32;
  const graph::FlatStore f32_entries(wide);
  const int64_t layout_elems = f32_entries.buffer_elems(DType::f32);
  // optimizer.freeze: what backward skips (graph::Executor::set_frozen; the whole graph's
  // executor prunes, a pipeline stage's and ZeRO-3's skip frozen weight gradients only).
  const ParamGroups groups(job.optimizer, g, job.model.arch);
  graph::BackwardSet frozen_all =
      graph::backward_set(g, groups.frozen_mask(), !zero3 && job.parallel.pipeline == 1);
  // Frozen gradients no exchange sends, as zero pages (graph::Executor's zero_grads).
  frozen_all.scratch = zero_gradients(job, g, groups);
  const graph::BackwardSet frozen_only = graph::backward_set(g, groups.frozen_mask(), false);
  // A pipeline stage steps its span of the layout (runtime/pipeline.h; ZeRO shards it):
  // the masters and optimizer state are the largest stage's here, each stage's below.
  const std::vector<graph::Stage> stages =
      job.parallel.pipeline > 1 ? job_stages(job.parallel, g) : std::vector<graph::Stage>{};
  std::vector<int64_t> spans = {layout_elems};
  if (!stages.empty()) {
    spans.clear();
    for (const auto& [lo, hi] : stage_spans(f32_entries.entries(), stages, layout_elems))
      spans.push_back(hi - lo);
  }
  // A stage's executor holds the parameters its nodes use, and their gradients (the
  // pages under them: FlatStore::allocate_held): the largest stage's here, each's below.
  std::vector<size_t> held_params, held_grads;
  for (const graph::Stage& st : stages) {
    const std::vector<char> used = graph::stage_params(g, st);
    const bool all = std::find(used.begin(), used.end(), 0) == used.end();
    held_params.push_back(all ? ex.params : graph::FlatStore(g.param_layout()).held_bytes(used));
    held_grads.push_back(all ? ex.grads : f32_entries.held_bytes(used));
  }
  const size_t stage_params_bytes =
      stages.empty() ? ex.params : *std::max_element(held_params.begin(), held_params.end());
  size_t stage_grads_bytes =
      stages.empty() ? ex.grads : *std::max_element(held_grads.begin(), held_grads.end());
  if (!frozen_all.scratch.empty() && !zero2) {  // the pages under the others (allocate_held)
    std::vector<char> backed;
    for (char z : frozen_all.scratch) backed.push_back(z != 0 ? 0 : 1);
    stage_grads_bytes = f32_entries.held_bytes(backed);
  }
  const std::string stage_note = stages.empty() ? "" : ", the largest pipeline stage's";
  std::vector<int64_t> ranges;  // each stage's largest shard of its span (ZeRO), or all of it
  for (int64_t span : spans)
    ranges.push_back(sharded ? shard_of(span, world - 1, world).size() : span);
  const int64_t last_shard = *std::max_element(ranges.begin(), ranges.end());
  if (zero3) {  // this rank's range, in the compute dtype, indexed as the fp32 layout
    const size_t bytes = static_cast<size_t>(last_shard) * dtype_size(policy.compute);
    const std::string note = fmt::format(
        "{}, this rank's range (ZeRO-3: 1/{} of it; each block gathered before "
        "use, counted with the activations)",
        dtype_name(policy.compute), world);
    if (job.memory.offload.params) {  // pinned host memory (runtime/zero_params.h)
      e.host.push_back({"parameters", CachingAllocator::size_class(bytes), note});
    } else {
      add("parameters", round(bytes), note);
    }
  } else {
    add("parameters", stage_params_bytes,
        (policy.half()
             ? fmt::format("{} (normalisation parameters f32)", dtype_name(policy.compute))
             : std::string("f32")) +
            stage_note);
  }
  std::string shard_note;
  if (sharded || !stages.empty())
    f32_layout = round(static_cast<size_t>(last_shard) * sizeof(float));
  // optimizer.freeze with the optimizer on the host: a frozen tensor's range of each of
  // the algorithm's buffers is zero pages that commit nothing (optim::drops_frozen_state),
  // so a buffer holds the pages under the trained tensors of its rank's segments (a rank
  // whose segments hold no frozen one, a whole buffer): the trainer's segments, sharded
  // as its optimizer's. Per stage (or the whole model) the largest data rank's; unused
  // where nothing is frozen (frozen_holes false).
  const bool host_optimizer = job.device.is_cpu() || job.memory.offload.optimizer;
  std::vector<size_t> frozen_state(ranges.size(), 0);  // one buffer, per stage
  bool frozen_holes = false;
  if (host_optimizer && groups.any_frozen()) {
    const std::vector<optim::ParamSegment> segments =
        segments_of(f32_entries.entries(), job.optimizer.no_decay, groups);
    const std::vector<std::pair<int64_t, int64_t>> lohi =
        stages.empty() ? std::vector<std::pair<int64_t, int64_t>>{{0, layout_elems}}
                       : stage_spans(f32_entries.entries(), stages, layout_elems);
    for (size_t st = 0; st < lohi.size(); ++st) {
      const auto [lo, hi] = lohi[st];
      for (int r = 0; r < (sharded ? world : 1); ++r) {
        const ShardRange sh = sharded ? shard_of(hi - lo, r, world, lo) : ShardRange{lo, hi};
        const std::vector<optim::ParamSegment> mine =
            optim::shard_segments(segments, sh.begin, sh.end, optim::SegmentSplit::allowed);
        const bool holes = optim::drops_frozen_state(mine, Device::cpu());
        ByteRanges held;
        for (const auto& [a, b] : optim::stateful_ranges(mine))
          held.emplace_back(static_cast<size_t>(a) * sizeof(float),
                            static_cast<size_t>(b) * sizeof(float));
        frozen_holes = frozen_holes || holes;
        frozen_state[st] =
            std::max(frozen_state[st],
                     holes ? held_pages_bytes(held) : round(static_cast<size_t>(sh.size()) * 4));
      }
    }
  }
  const auto state_buffer = [&](size_t whole) {  // the largest stage's, one buffer
    return frozen_holes ? *std::max_element(frozen_state.begin(), frozen_state.end()) : whole;
  };
  if (sharded) shard_note = fmt::format(" (ZeRO-{}: 1/{} of it)", job.parallel.zero_stage, world);
  if (!stages.empty()) shard_note += ", the largest pipeline stage's parameters";
  // ZeRO-2: no whole gradient buffer; backward writes into buckets (dist/zero_grads.h),
  // counted with the step's activations (graph::GradBuckets).
  // The gradient buckets as the trainer plans them (dist/ddp.h): ZeRO-2 holds each
  // one's gradients while it fills (counted with the step's activations,
  // graph::GradBuckets), compression allocates while it exchanges one.
  std::vector<dist::GradRange> grad_ranges;
  for (const graph::FlatEntry& e : f32_entries.entries())
    grad_ranges.push_back({e.offset, e.spec.shape.numel()});
  const auto bucket_bytes = static_cast<size_t>(job.comm.bucket_mb * 1024.0 * 1024.0);
  // The model's (`planned`) or each pipeline stage's, planned once; `every`: whether
  // they hold every parameter (the trainer's every_param).
  bool planned_all = true;
  const std::vector<dist::Bucket> planned = gradient_buckets(
      f32_entries.entries(), g, groups, nullptr, false, bucket_bytes, &planned_all);
  std::vector<std::vector<dist::Bucket>> stage_buckets;
  std::vector<char> every;
  if (stages.empty()) every.push_back(planned_all ? 1 : 0);
  for (const graph::Stage& st : stages) {
    bool all = true;
    stage_buckets.push_back(
        gradient_buckets(f32_entries.entries(), g, groups, &st, zero2, bucket_bytes, &all));
    every.push_back(all ? 1 : 0);
  }
  const auto buckets_of = [&](size_t k) -> const std::vector<dist::Bucket>& {
    return stages.empty() ? planned : stage_buckets[k];
  };
  // What each stage's (or the model's) buckets send: the data-parallel traffic's base.
  std::vector<double> sent_bytes;
  for (size_t k = 0; k < every.size(); ++k) {
    int64_t n = 0;
    for (const dist::Bucket& b : buckets_of(k)) n += b.end - b.begin;
    sent_bytes.push_back(static_cast<double>(n) * sizeof(float));
  }
  // ZeRO-1 and 2 gather what each step changed: the span, or with optimizer.freeze the
  // buckets' cover of it (MasterWeights::set_cover), each stage's; and the buffer that
  // carries it after the step (gather_cover's, or ZeRO-2 with masters broadcast_shards').
  std::vector<double> gathered_bytes;
  int64_t gather_buffer = 0;
  if (sharded && !zero3) {
    const auto piece = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / 4));
    const std::vector<std::pair<int64_t, int64_t>> stage_span =
        stages.empty() ? std::vector<std::pair<int64_t, int64_t>>{{0, layout_elems}}
                       : stage_spans(f32_entries.entries(), stages, layout_elems);
    for (size_t k = 0; k < stage_span.size(); ++k) {
      const auto [lo, hi] = stage_span[k];
      const ShardRange last = shard_of(hi - lo, world - 1, world, lo);
      // As the trainer decides: a cover where something is frozen and a bucket misses it.
      LayoutRanges cover;
      if (groups.any_frozen() && every[k] == 0) cover = bucket_cover(buckets_of(k), lo, hi);
      int64_t n = hi - lo;
      if (!cover.empty()) {
        n = 0;
        for (const auto& [a, b] : cover) n += b - a;
      }
      gathered_bytes.push_back(static_cast<double>(n) * sizeof(float));
      const bool through_pieces = zero2 && policy.half() && job.precision.master_weights;
      gather_buffer = std::max(
          gather_buffer, through_pieces
                             ? broadcast_shards_elems(last, piece, cover.empty() ? nullptr : &cover)
                         : cover.empty() ? 0
                                         : gather_cover_elems(last, cover, piece));
    }
  }
  // Gradient compression (runtime/grad_compression.h; not with ZeRO-2).
  const bool compressed = job.compress.method != CompressMethod::none && !zero2;
  graph::GradBuckets buckets;
  if (zero2 || (compressed && stages.empty())) {
    buckets.bucket_of.assign(grad_ranges.size(), -1);
    for (size_t b = 0; b < planned.size(); ++b) {
      buckets.bytes.push_back(
          zero2 ? round(static_cast<size_t>(planned[b].end - planned[b].begin) * sizeof(float))
                : 0);  // compression: the gradients stay in the flat buffer
      for (int p : planned[b].params)
        buckets.bucket_of[static_cast<size_t>(p)] = static_cast<int>(b);
    }
  }
  if (zero2) {
    add("gradients", f32_layout, "f32, this rank's shard" + shard_note);
  } else {
    add("gradients", stage_grads_bytes,
        "f32, every precision" + stage_note +
            (frozen_all.scratch.empty() ? "" : "; none for the frozen tensors no bucket sends"));
  }
  // Compression: the residual (the compressed tensors' entries, with error feedback)
  // and PowerSGD's Q live for the run; each bucket's exchange holds its buffers from its
  // start to its completion (compress::exchange_bytes): started as the bucket's last
  // gradient is ready, advanced as the next one's is and, with a second collective,
  // completed at the one after (overlap on, the last ones after backward), or one bucket
  // after another after backward (off). A pipeline stage compresses its
  // own buckets (dist::plan_buckets_of, as the trainer plans them): its own residual,
  // Q and exchanges, the largest stage's in the table.
  size_t exchange_after = 0;  // overlap off: the largest stage's exchanges after backward
  double compressed_bus = 0;  // the data traffic of the compressed exchanges
  std::vector<StageCompression> stage_compression;
  StageCompression most_compression;  // the largest stage's residual and Q, for the table
  if (compressed) {
    // Frozen tensors stay dense: the plan's view of the layout, once for every stage.
    const std::vector<compress::ParamInfo> params =
        compression_params(f32_entries.entries(), groups);
    const auto of = [&](const std::vector<dist::Bucket>& b, size_t stage) {
      StageCompression c;
      const std::vector<compress::BucketPlan> plans =
          compress::plan_compression(job.compress, b, params);
      const int64_t residual = compress::residual_elems(job.compress, plans);
      const int64_t q = compress::powersgd_q_elems(job.compress, plans);
      c.residual = residual > 0 ? round(static_cast<size_t>(residual) * sizeof(float)) : 0;
      c.q = q > 0 ? round(static_cast<size_t>(q) * sizeof(float)) : 0;
      // The last rank's server residual: its segments are the longest.
      const int64_t server = compress::server_residual_elems(job.compress, plans, world, world - 1);
      c.server = server > 0 ? round(static_cast<size_t>(server) * sizeof(float)) : 0;
      // ZeRO-1 then gathers the stepped parameters: (n-1)/n of the span, or of the
      // buckets' cover of it with optimizer.freeze.
      c.bus = compress::bus_bytes_per_step(job.compress, plans, world) +
              (sharded ? static_cast<double>(world - 1) / world * gathered_bytes[stage] : 0.0);
      c.buckets.bucket_of.assign(grad_ranges.size(), -1);
      std::vector<graph::BucketExchange> exchanges;
      for (size_t k = 0; k < b.size(); ++k) {
        c.buckets.bytes.push_back(0);  // the gradients stay in the flat buffer
        for (int p : b[k].params) c.buckets.bucket_of[static_cast<size_t>(p)] = static_cast<int>(k);
        const compress::ExchangeBytes x =
            compress::exchange_bytes(job.compress, plans[k], world, job.device, round);
        exchanges.push_back({x.start, x.held, x.advance, x.held2, x.complete});
      }
      // Overlap on: in backward (the memory plan), the last ones after it; off: one
      // bucket after another after backward (GradSync::finish), in the same sequence.
      if (job.comm.overlap) {
        c.buckets.exchange = std::move(exchanges);
      } else {
        graph::ExchangeSequence after;
        for (const graph::BucketExchange& x : exchanges)
          c.exchange_after = std::max(c.exchange_after, after.ready(x));
        c.exchange_after = std::max(c.exchange_after, after.finish());
      }
      return c;
    };
    for (size_t k = 0; k < every.size(); ++k) stage_compression.push_back(of(buckets_of(k), k));
    if (stages.empty()) buckets.exchange = stage_compression[0].buckets.exchange;
    for (const StageCompression& c : stage_compression) {
      most_compression.residual = std::max(most_compression.residual, c.residual);
      most_compression.q = std::max(most_compression.q, c.q);
      most_compression.server = std::max(most_compression.server, c.server);
      compressed_bus = std::max(compressed_bus, c.bus);
      exchange_after = std::max(exchange_after, c.exchange_after);
    }
    add("compression residual", most_compression.residual,
        "f32, what this rank has not sent yet (error feedback), its compressed tensors'" +
            stage_note);
    add("compression server residual", most_compression.server,
        "f32, what this rank's sums of its segments have not sent yet (compress.exchange "
        "two_phase)" +
            stage_note);
    add("PowerSGD Q", most_compression.q, "f32, kept between steps" + stage_note);
    // A save (GradCompression::state) writes each rank's residual into its own shard
    // as it lies: nothing is gathered, nothing copied on the CPU.
  }
  add("buffers", ex.buffers, "batch-norm running statistics");
  add("workspace", ex.workspace, "shared by the ops, the largest one's");
  // Offloaded (runtime/master_weights.h), the optimizer's side lives in pinned host
  // memory, rounded by the host cache's size classes: the masters, the state, a copy
  // of the gradients and a twin of the parameters the step writes before the upload.
  const bool offload = job.memory.offload.optimizer;
  auto add_optimizer = [&](std::string kind, size_t bytes, std::string note) {
    if (!offload) return add(std::move(kind), bytes, std::move(note));
    if (bytes > 0) e.host.push_back({std::move(kind), bytes, std::move(note)});
  };
  const graph::ExecutorBytes host = graph::executor_bytes(
      g, job.device, [](size_t b) { return CachingAllocator::size_class(b); });
  // ZeRO-Offload: the host holds this rank's shard of each (the largest rank's).
  const size_t host_layout =
      sharded ? CachingAllocator::size_class(
                    static_cast<size_t>(shard_of(layout_elems, world - 1, world).size()) *
                    sizeof(float))
              : host.grads;
  const bool masters = policy.half() && job.precision.master_weights;
  if (masters)
    add_optimizer("master weights", offload ? host_layout : f32_layout,
                  "fp32 copy the optimizer steps" + shard_note);
  const OptimizerOptions& o = job.optimizer;
  const int ema = o.ema.decay ? 1 : 0;
  const int states = optim::state_buffer_count(o) - ema;  // the algorithm's own
  const auto ranged_items = static_cast<size_t>(optim::state_buffer_count(o) + (masters ? 1 : 0));
  add_optimizer("optimizer state",
                state_buffer(offload ? host_layout : f32_layout) * static_cast<size_t>(states),
                std::string(o.name == OptimizerName::sgd ? "momentum" : "exp_avg, exp_avg_sq") +
                    (frozen_holes ? ", trained tensors only" : "") + shard_note);
  if (ema) {
    add_optimizer("EMA weights", offload ? host_layout : f32_layout,
                  "f32 average of the weights (optimizer.ema)" + shard_note);
  }
  if (offload) {
    add_optimizer("gradients (host copy)", host_layout, "f32, downloaded for each step");
    if (!sharded) {
      add_optimizer("parameters (host twin)", host.params,
                    "written by the CPU step, then uploaded");
    } else if (!policy.half()) {
      add_optimizer("parameters (host shard)", host_layout,
                    "this rank's range, stepped on the host, then uploaded");
    }
    for (const MemoryItem& i : e.host) e.host_bytes += i.bytes;
  }
  const bool accumulates = job.parallel.micro_batches > 1 && !zero2;  // ZeRO-2: in its shard
  if (accumulates)
    add("gradient accumulation", stage_grads_bytes, "f32, over micro-batches" + stage_note);
  // Data: what the feed holds. Images: the loader's slots (prefetch + 1 with workers),
  // each a batch of f32 images and i32 labels, and the feed's label copy. Tokens: the
  // batch in use and the next one, each ids and labels i32 [batch, seq]; labelled texts
  // (a classifier's labels are [batch]): the one batch the feed refills.
  const graph::TensorSpec& in = g.value(m.input).spec;
  const size_t in_bytes = static_cast<size_t>(in.shape.numel()) * dtype_size(in.dtype);
  const size_t label_bytes = static_cast<size_t>(g.value(m.labels).spec.shape.numel()) * 4;
  const bool images = in.dtype != DType::i32;
  const int slots = job.data.workers == 0 ? 1 : job.data.prefetch + 1;
  const bool texts = !images && g.value(m.labels).spec.shape.rank() == 1;
  const size_t data = images ? static_cast<size_t>(slots) * (round(in_bytes) + round(label_bytes)) +
                                   round(label_bytes)
                             : (texts ? 1 : 2) * (round(in_bytes) + round(label_bytes));
  add("data", data,
      images  ? fmt::format("{} loader slot(s) of {} samples", slots, batch)
      : texts ? fmt::format("1 batch of {} texts", batch)
              : fmt::format("2 batches of {} windows", batch));
  // An image dataset read from files is held whole for the run: u8 pixels and labels of
  // both splits (data::read_idx, read_cifar), whatever data.limit uses of them.
  if (const std::optional<DatasetShape> ds = dataset_shape(job.data.dataset)) {
    const auto pixels = static_cast<size_t>(ds->channels) * ds->image_size * ds->image_size;
    size_t held = 0;
    for (const int64_t n : {ds->train_samples, ds->test_samples})
      held += round(static_cast<size_t>(n) * pixels) + round(static_cast<size_t>(n));
    add("dataset", held,
        fmt::format("{}, {} + {} images and labels, u8", to_string(job.data.dataset),
                    ds->train_samples, ds->test_samples));
  }
  for (const MemoryItem& i : e.state) e.state_bytes += i.bytes;

  // ZeRO-3: the gathered blocks, held as runtime/zero_params.h holds them.
  const graph::ParamUnits units(g, f32_entries.entries(), m.loss);
  const graph::ParamGathers gathers{&units, policy.compute, f32_entries.entries()};
  e.train = graph::plan_activations(g, graph::Mode::train, {}, round, blocks_per_segment(job, g),
                                    buckets.bytes.empty() ? nullptr : &buckets,
                                    zero3 ? &gathers : nullptr, nullptr, {}, &frozen_all);
  exchange_after = std::max(exchange_after, e.train.exchange_after);
  if (e.train.at_end + exchange_after > e.train.peak) {
    e.train.peak = e.train.at_end + exchange_after;
    e.train.node = -3;  // the gradient exchange after backward
  }
  const size_t gather_after = gather_buffer > 0 ? round(static_cast<size_t>(gather_buffer) * 4) : 0;
  if (e.train.at_end + gather_after > e.train.peak) {
    e.train.peak = e.train.at_end + gather_after;
    e.train.node = -4;  // the step's gather
  }
  std::vector<char> eval_pins(static_cast<size_t>(g.num_values()), 0);
  eval_pins[static_cast<size_t>(m.logits)] = 1;
  eval_pins[static_cast<size_t>(m.targets)] = 1;
  e.eval = graph::plan_activations(g, graph::Mode::eval, eval_pins, round, 0, nullptr,
                                   zero3 ? &gathers : nullptr);
  // model.init_from (runtime::load_init_weights, streamed), before the first step and
  // before the data feed exists: each of the file's tensors read, its f32 widening and
  // its rows in layout order, one tensor at a time, and the f32 buffers (batch-norm
  // statistics) whole, all in host memory: counted where the host is the device (the
  // CPU), on every rank alike (each stage takes what it holds). Counted whether or not
  // a resume will skip it. Sized from the file's header (an absent or damaged file is
  // train's exit 2: nothing counted here).
  size_t init_extra = 0;
  if (job.model.init_from && job.device.is_cpu()) {
    try {
      SafetensorsReader file(*job.model.init_from);
      for (const SafetensorsEntry& t : file.entries()) {
        // Read (the file's bytes), widened (a half tensor's f32 copy, the read freed
        // after it), then put in layout order (a second f32 copy).
        const size_t read = round(static_cast<size_t>(t.end - t.begin));
        const size_t f32 = round(static_cast<size_t>(t.shape.numel()) * sizeof(float));
        const size_t most = t.dtype == DType::f32 ? read + f32 : std::max(read + f32, 2 * f32);
        init_extra = std::max(init_extra, most);
      }
      std::vector<graph::FlatEntry> wide_buffers = g.buffer_layout();
      for (graph::FlatEntry& b : wide_buffers) b.spec.dtype = DType::f32;
      const int64_t buffer_elems = graph::FlatStore(wide_buffers).buffer_elems(DType::f32);
      if (buffer_elems > 0) init_extra += round(static_cast<size_t>(buffer_elems) * sizeof(float));
    } catch (const Error&) {
      init_extra = 0;
    }
  }
  if (job.parallel.pipeline > 1) {
    std::vector<size_t> stage_state;
    for (size_t s = 0; s < ranges.size(); ++s) {
      const size_t grads_items = accumulates ? 2 : 1;  // the gradients and their accumulation
      size_t compression = 0;  // this stage's residual and Q for the largest stage's
      if (compressed) {
        const StageCompression& c = stage_compression[s];
        compression = most_compression.residual + most_compression.q + most_compression.server -
                      c.residual - c.q - c.server;
      }
      const size_t range_bytes = round(static_cast<size_t>(ranges[s]) * sizeof(float));
      const size_t states_here = frozen_holes ? frozen_state[s] : range_bytes;
      stage_state.push_back(e.state_bytes - ranged_items * f32_layout -
                            static_cast<size_t>(states) * (state_buffer(f32_layout) - f32_layout) +
                            (ranged_items - static_cast<size_t>(states)) * range_bytes +
                            static_cast<size_t>(states) * states_here - stage_params_bytes -
                            grads_items * stage_grads_bytes + held_params[s] +
                            grads_items * held_grads[s] - compression);
    }
    pipeline_activations(job, m, round, eval_pins, stages, stage_state, stage_compression,
                         frozen_only, e);
    for (MemoryEstimate::Stage& st : e.stages) {  // each stage reads model.init_from too
      if (init_extra == 0) break;
      const size_t at_init =
          stage_state[static_cast<size_t>(st.stage)] - data + init_extra + e.host_bytes;
      if (at_init > st.peak) {
        st.peak = at_init;
        st.at = kInitFromPeak;
      }
    }
  }
  // After each evaluation forward the trainer reads the logits on the host as f32
  // (TrainSession::evaluate): half logits are widened into a copy then.
  const graph::TensorSpec& logits = g.value(m.logits).spec;
  if (logits.dtype != DType::f32) {
    const size_t wide = e.eval.at_end + round(static_cast<size_t>(logits.shape.numel()) * 4);
    if (wide > e.eval.peak) {
      e.eval.peak = wide;
      e.eval.node = -2;  // after the forward
    }
  }
  // An evaluation opens the test split's image feed (TrainSession::evaluate_model) while
  // the training feed keeps its slots: as many slots again, of the same batch. Seen
  // once backward skips enough (a linear probe's) for an evaluation to set the peak.
  if (images && e.stages.empty()) e.eval.peak += data;
  e.train_peak_at = where(g, e.train);
  e.eval_peak_at = where(g, e.eval);
  const bool train_higher = e.train.peak >= e.eval.peak;
  e.peak_bytes = e.state_bytes + std::max(e.train.peak, e.eval.peak);
  // On the CPU (the offload tests) host memory is the device's: the same peak.
  if (job.device.is_cpu()) e.peak_bytes += e.host_bytes;
  e.peak_at = train_higher ? e.train_peak_at : e.eval_peak_at + " (evaluation)";
  for (const MemoryEstimate::Stage& st : e.stages) {  // a pipeline: the highest stage's
    if (st.stage == 0 || st.peak > e.peak_bytes) {
      e.peak_bytes = st.peak;
      e.peak_at = fmt::format("pipeline stage {}: {}", st.stage,
                              st.train >= st.eval ? st.at : std::string("evaluation"));
    }
  }
  // precision.master_weights: false saves its half parameters widened to f32, the whole
  // layout at once (MasterWeights::state), on top of the state and what the last step or
  // evaluation left held: the peak once frozen layers hold few activations.
  if (policy.half() && !job.precision.master_weights && !sharded && stages.empty() &&
      job.parallel.tensor == 1) {
    size_t at_save = e.state_bytes + std::max(e.train.at_end, e.eval.at_end) +
                     round(static_cast<size_t>(layout_elems) * sizeof(float));
    if (job.device.is_cpu()) at_save += e.host_bytes;
    if (at_save > e.peak_bytes) {
      e.peak_bytes = at_save;
      e.peak_at = "a checkpoint save (the half parameters widened to f32)";
    }
  }
  // model.init_from's read (above; a pipeline's stages counted it each), the peak where
  // it is the highest point.
  if (init_extra > 0 && stages.empty()) {
    const size_t at_init = e.state_bytes - data + init_extra + e.host_bytes;
    if (at_init > e.peak_bytes) {
      e.peak_bytes = at_init;
      e.peak_at = kInitFromPeak;
    }
  }
  e.step_flops = train_flops(g, frozen_all, job.parallel.micro_batches);
  if (g.forward_flops() > 0) {
    const double forward = g.forward_flops() * static_cast<double>(job.parallel.micro_batches);
    e.backward_share = (e.step_flops - forward) / (2.0 * forward);
  }
  e.comm = communication(job, g, tp_plan, sent_bytes);
  if (world > 1) e.comm.zero_stage = job.parallel.zero_stage;
  if (sharded && !zero2) {  // ZeRO-1: the buckets reduced into owners, the span gathered
    const double share = static_cast<double>(world - 1) / world;
    e.comm.data = 0;
    for (size_t k = 0; k < spans.size(); ++k)
      e.comm.data = std::max(e.comm.data, share * (sent_bytes[k] + gathered_bytes[k]));
  }
  if (zero2) {  // ZeRO-2 and 3 reduce each micro-batch's buckets into their owners
    const double share = static_cast<double>(world - 1) / world;
    const double micro = job.parallel.micro_batches;
    e.comm.data = 0;
    for (size_t k = 0; k < sent_bytes.size(); ++k) {
      e.comm.data =
          std::max(e.comm.data,
                   micro * share * sent_bytes[k] +
                       (zero3 ? micro * share * e.train.gathered_bytes  // every pass's gathers
                              : share * gathered_bytes[k]));  // ZeRO-2: the stepped parameters
    }
  }
  if (compressed) {
    e.comm.data_dense = e.comm.data;
    e.comm.data = compressed_bus;
    e.comm.compressed = true;
    // Top-k and 1-bit with compress.exchange gather: what a rank receives grows with the
    // data ranks, while a dense all-reduce's traffic does not.
    const std::string note = gather_note(job.compress, world, compressed_bus, e.comm.data_dense);
    if (!note.empty()) {
      e.caveat = e.caveat.empty() ? note : e.caveat + "; " + note;
    }
  }
  e.forward_flops = g.forward_flops();
  e.forward_param_bytes = static_cast<double>(ex.params);
  e.forward_ops = static_cast<int64_t>(g.nodes().size());
  if (job.parallel.pipeline > 1) {  // the stage with the most FLOPs
    e.forward_flops = 0;
    for (const graph::Stage& st : stages) {
      if (st.flops <= e.forward_flops) continue;
      e.forward_flops = st.flops;
      e.forward_param_bytes =
          static_cast<double>(st.param_elems) * static_cast<double>(dtype_size(policy.compute));
      e.forward_ops = st.end - st.begin;
    }
  }
  if (job.parallel.tensor > 1) {
    // A save writes the one-rank model's layout by shard: each tensor rank assembles its
    // range of its stage's span (runtime::assemble_range) in a range-sized buffer and
    // keeps the range's parameters and optimizer state, on top of the state and what
    // the last step or evaluation left held.
    int64_t whole_span = whole_elems;
    if (job.parallel.pipeline > 1) {
      whole_span = 0;
      for (const auto& [lo, hi] : stage_spans(whole_entries, stages, whole_elems))
        whole_span = std::max(whole_span, hi - lo);
    }
    const int64_t range = shard_of(whole_span, job.parallel.tensor - 1, job.parallel.tensor).size();
    const size_t save =
        round(static_cast<size_t>(range) * sizeof(float)) * static_cast<size_t>(2 + states);
    // A range stepped here (ZeRO's shard, a stage's span) is read in place: the data
    // group's shards are reduced into its rank 0 range by range, never widened.
    size_t at_save = e.state_bytes + std::max(e.train.at_end, e.eval.at_end) + save;
    if (job.device.is_cpu()) at_save += e.host_bytes;
    if (at_save > e.peak_bytes) {
      e.peak_bytes = at_save;
      e.peak_at = "a checkpoint save (this rank's range of the whole model)";
    }
    const std::string note = fmt::format(
        "parallel.tensor = {}: the figures are tensor rank 0's part of the model; a checkpoint "
        "save assembles each tensor rank's range of the whole model ({})",
        job.parallel.tensor, format_bytes(save));
    e.caveat = e.caveat.empty() ? note : e.caveat + "; " + note;
  }

  if (options.step_time) {
    try {
      e.step_time = estimate_step_time(job, g, &frozen_all);
    } catch (const RunError& err) {  // a CPU whose peak dtrain cannot measure
      e.step_time_missing = "no step time: " + err.message();
    }
  }
  return e;
}

}  // namespace dtrain::runtime
