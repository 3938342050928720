// The training loop, on one process or as one data-parallel rank. One optimizer
// step = parallel.micro_batches forward/backward passes on each rank; the gradient
// is the mean over every labelled element (image, token, masked token) of the
// global batch: each backward starts from d loss = its batch's label count (a sum
// over labels), the ranks' sums meet in the bucketed all-reduce (dist/ddp.h), and
// one scale by 1 / (labels in the global batch) follows. Then optional global-norm
// clipping and the fused optimizer update at lr_at(step). Rank 0 alone prints,
// writes metrics and checkpoints (the states are replicated; checked at each save);
// every rank writes <output_dir>/logs/rank-N.log.
// device: cuda puts the model, gradients, optimizer state and batches on the GPU;
// the host reads back one float per micro-batch (the loss, for the log and the
// non-finite check) and, for evaluation, the logits and targets.
#include "runtime/trainer.h"

#include "core/checksum.h"
#include "dist/launcher.h"
#include "models/transformer.h"
#include "runtime/train_session.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <unistd.h>
#include <memory>

namespace dtrain::runtime {

namespace {

std::string fnv1a_hex(std::string_view s) { return fmt::format("{:016x}", fnv1a(s)); }

}  // namespace

float read_scalar(const Tensor& t) { return kernels::to_host(t).data<float>()[0]; }

Tensor host_f32(const Tensor& t) {
  const Tensor h = kernels::to_host(t);
  if (h.dtype() == DType::f32) return h;
  Tensor f = Tensor::empty(h.shape(), DType::f32);
  kernels::cast(h, f);
  return f;
}

TrainSession::TrainSession(const TrainRequest& r, dist::Communicator& comm)
    : req_(r), job_(r.job), comm_(comm) {
  require_supported(job_, comm.size());
  estimate_ = require_fits(job_);
  // memory.pool: false on a GPU: plain cudaMalloc / cudaFree from the first tensor on
  // (the host's switch is thrown in cmd_train, before any tensor).
  if (job_.device.is_cuda()) kernels::set_pool_caching(job_.device, job_.memory.pool);
  micro_batches_ = job_.parallel.micro_batches;
  const int64_t batch = job_.data.micro_batch;
  policy_.compute = compute_dtype(job_.precision.dtype);
  ModelOptions model = job_.model;
  model.pad_token_id = padding_token(job_);  // a BERT classifier's attention mask
  model_ = models::build_model(model, batch, policy_);
  groups_ = ParamGroups(job_.optimizer, model_.graph, job_.model.arch);
  coord_ = dist::grid_coord(comm.rank(), dist::degrees_of(job_.parallel));
  if (job_.parallel.tensor > 1) {  // the split graph's ops reach the group once connected
    whole_layout_ = whole_f32_layout(model_.graph);
    tp_group_ = std::make_shared<CommTensorGroup>(coord_.tp, job_.parallel.tensor);
    tp_plan_ = graph::split_tensor_parallel(model_.graph, tp_group_);
  }
  // ZeRO-2 keeps no whole gradient buffer: backward writes into dist::ShardedGradSync's
  // buckets (connect()), and each rank keeps its shard of the sum.
  // ZeRO-3 keeps no whole parameter buffer either: each rank holds its range of the
  // layout, and the executor sees a block's parameters while they are gathered.
  zero2_ = job_.parallel.zero_stage >= 2 && job_.parallel.data > 1;
  zero3_ = job_.parallel.zero_stage >= 3 && job_.parallel.data > 1;
  // A pipeline stage holds the parameters (and their gradients) its nodes use, its own
  // span and a copy of a weight tied to an earlier stage, addressed as the whole model's.
  std::vector<int> cuts;  // checkpointed segments restart at each stage's first block
  std::pair<int, int> nodes{0, -1};
  if (job_.parallel.pipeline > 1) {
    stages_ = job_stages(job_.parallel, model_.graph);
    for (size_t k = 1; k < stages_.size(); ++k) cuts.push_back(stages_[k].first_block);
    tied_ = std::make_unique<TiedWeights>(model_.graph, stages_);  // summed in train_step
    const graph::Stage& mine = stages_[static_cast<size_t>(coord_.pp)];
    nodes = {mine.begin, mine.end};
  }
  ex_ = std::make_unique<graph::Executor>(
      model_.graph, job_.device, zero2_ ? graph::GradBuffer::external : graph::GradBuffer::owned,
      zero3_ ? graph::ParamBuffer::external : graph::ParamBuffer::owned, nodes,
      zero_gradients(job_, model_.graph, groups_));
  if (job_.precision.tf32) ex_->set_math(kernels::MathMode::tf32);
  if (groups_.any_frozen()) ex_->set_frozen(groups_.frozen_mask());
  ex_->set_checkpointing(blocks_per_segment(job_, model_.graph), cuts);
  ex_->keep(model_.logits, graph::Mode::eval);  // evaluate() counts the correct predictions
  ex_->keep(model_.targets, graph::Mode::eval);
  counters_.seed = static_cast<uint64_t>(job_.run.seed);
  counters_.arch = job_.model.arch;
  if (const ArchPreset* a = find_arch(job_.model.arch); a && a->family != ModelFamily::cnn)
    counters_.heads = models::resolve_transformer(job_.model, a->family).heads;
  counters_.config_hash = fnv1a_hex(r.resolved_yaml);
  counters_.job_yaml = r.resolved_yaml;
  ex_->initialize(counters_.seed);
  const MasterMode mode = !policy_.half()                 ? MasterMode::fp32
                          : job_.precision.master_weights ? MasterMode::masters
                                                          : MasterMode::in_place;
  // ZeRO: this rank steps its shard of the fp32 layout (runtime/zero.h), over the data
  // axis (with tensor parallelism each tensor rank shards its own part). A pipeline
  // stage steps its own span of the layout (runtime/pipeline.h), and ZeRO shards that.
  const int64_t layout_elems = ex_->grads().buffer_elems(DType::f32);
  const int data = job_.parallel.data;
  std::pair<int64_t, int64_t> span{0, layout_elems};
  if (job_.parallel.pipeline > 1) {
    span =
        stage_spans(ex_->grads().entries(), stages_, layout_elems)[static_cast<size_t>(coord_.pp)];
  }
  ShardRange shard;
  if (job_.parallel.zero_stage >= 1 && data > 1) {
    shard = shard_of(span.second - span.first, coord_.dp, data, span.first);
  } else if (job_.parallel.pipeline > 1) {
    shard = shard_of(span.second - span.first, 0, 1, span.first);
  }
  shard.staged = job_.parallel.pipeline > 1;
  if (zero2_) {
    shard_grads_ =
        Tensor::empty(Shape{shard.size()}, DType::f32, &kernels::device_allocator(job_.device));
  }
  Tensor param_shard;
  if (zero3_) {  // memory.offload.params: in (pinned) host memory, copied up per gather
    Allocator* where = !job_.memory.offload.params ? &kernels::device_allocator(job_.device)
                       : job_.device.is_cuda()     ? &kernels::pinned_host_allocator()
                                                   : static_cast<Allocator*>(&host_allocator());
    param_shard = Tensor::empty(Shape{shard.size()}, policy_.compute, where);
  }
  weights_ = std::make_unique<MasterWeights>(*ex_, mode, counters_.seed, job_.device,
                                             job_.memory.offload.optimizer, shard, shard_grads_,
                                             param_shard);
  if (zero3_) {
    units_ = std::make_unique<graph::ParamUnits>(model_.graph, weights_->layout(), model_.loss);
    zero_params_ = std::make_unique<ShardedParams>(model_.graph, *units_, shard, param_shard,
                                                   weights_->shard_params(), job_.device);
    ex_->set_param_storage([this](int p) { return zero_params_->view(p); });
    ex_->hooks.pre_op = [this](int node, graph::Phase phase) { zero_params_->before(node, phase); };
  }
  weights_->set_gather_piece(
      std::max<int64_t>(1, static_cast<int64_t>(job_.comm.bucket_mb * 1024.0 * 1024.0 / 4)));
  const Tensor grads = weights_->grads();
  std::vector<optim::ParamSegment> segments =
      segments_of(weights_->layout(), job_.optimizer.no_decay, groups_);
  if (shard.ranged()) {
    segments =
        optim::shard_segments(segments, shard.begin, shard.end, optim::SegmentSplit::allowed);
  }
  opt_ = optim::make_optimizer(job_.optimizer, std::move(segments), weights_->shard().size(),
                               weights_->optimizer_device());
  if (shard.sharded() || tensor_split()) {
    // LAMB's trust ratio wants each whole tensor's norms: a tensor cut by a shard
    // boundary adds the data ranks' sums (one small all-reduce of every tensor's two
    // sums; a tensor one rank holds whole gets zeros from the others, so its sums are
    // exact), a tensor split over the tensor group adds the tensor ranks' (a second one,
    // of the split tensors' sums only: a replicated tensor is whole on every rank).
    std::vector<size_t> tensor_of;
    for (const optim::ParamSegment& seg : opt_->segments()) {
      size_t t = 0;
      while (weights_->layout()[t].name != seg.name) ++t;
      tensor_of.push_back(t);
    }
    std::vector<size_t> split;  // the tensors the tensor-parallel pass divided
    for (size_t t = 0; t < weights_->layout().size(); ++t)
      if (weights_->layout()[t].spec.split.split()) split.push_back(t);
    const size_t tensors = weights_->layout().size();
    const bool sharded = shard.sharded();
    opt_->set_segment_sums([this, tensor_of, split, tensors, sharded](std::vector<double>& p2,
                                                                      std::vector<double>& u2) {
      std::vector<double> all(2 * tensors, 0.0);
      for (size_t s = 0; s < tensor_of.size(); ++s) {
        all[2 * tensor_of[s]] = p2[s];
        all[2 * tensor_of[s] + 1] = u2[s];
      }
      if (sharded) {
        Tensor t = Tensor::wrap(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::f64);
        (grid_ ? grid_->group(dist::Axis::data) : comm_).all_reduce(t);
      }
      if (!split.empty()) {
        std::vector<double> parts;
        for (size_t t : split) parts.insert(parts.end(), {all[2 * t], all[2 * t + 1]});
        Tensor t =
            Tensor::wrap(parts.data(), Shape{static_cast<int64_t>(parts.size())}, DType::f64);
        grid_->group(dist::Axis::tensor).all_reduce(t);
        for (size_t k = 0; k < split.size(); ++k) {
          all[2 * split[k]] = parts[2 * k];
          all[2 * split[k] + 1] = parts[2 * k + 1];
        }
      }
      for (size_t s = 0; s < tensor_of.size(); ++s) {
        p2[s] = all[2 * tensor_of[s]];
        u2[s] = all[2 * tensor_of[s] + 1];
      }
    });
  }
  // A pipeline stage's: its held gradients alone; frozen ones no exchange sends: none.
  if (micro_batches_ > 1 && !zero2_) {
    if (!ex_->grads().held_mask().empty()) {
      grad_acc_store_ = graph::FlatStore(ex_->grads().entries());
      grad_acc_store_.allocate_held(ex_->grads().held_mask(), ex_->grads().unheld());
      grad_acc_ = grad_acc_store_.flat(DType::f32);
    } else {
      grad_acc_ = Tensor::empty(grads.shape(), DType::f32, &kernels::device_allocator(job_.device));
    }
  }
  // A BERT classifier predicts one class per text, as the image models do per image.
  language_model_ =
      is_language_model(find_arch(job_.model.arch)->family) && !job_.model.num_classes;
  // Data-parallel ranks read their shares; the stages of one pipeline read the same.
  source_ = DataSource::open(job_, counters_.seed, {coord_.dp, job_.parallel.data});
  out_dir_ = job_.run.output_dir;
  ckpt_dir_ = job_.train.checkpoint.dir.empty() ? out_dir_ / "checkpoints"
                                                : fs::path(job_.train.checkpoint.dir);
  prepare_samples();  // the tokenizer and prompt: a bad one is the job's error, before a step
  resume_if_asked();
  // A tensor frozen now holds no optimizer state (the resume dropped any it had), so none
  // of its steps so far count: unfrozen later, it starts as a fresh parameter.
  for (const std::string& name : groups_.frozen_names())
    counters_.frozen_steps[name] = opt_->step_count();
  opt_->set_frozen_steps(counters_.frozen_steps);  // the checkpoint's (a fresh run: none)
  counters_.classes = source_->class_names();      // the next saves name them (a resume checked)
  // model.init_from starts a fresh run only: a resumed one continues from its checkpoint
  // (and never reads the file, so a job that names it resumes in any layout).
  if (job_.model.init_from && !resumed_) init_from(*job_.model.init_from);
  // optimizer.ema: the average starts as the weights now set (a checkpoint's own
  // average, when it has one, was loaded with it).
  if (opt_->has_ema() && !opt_->ema_ready()) opt_->start_ema(weights_->target().flat);
  train_ = std::make_unique<DeviceFeed>(
      source_->feed(FeedSplit::train, counters_.position, feed_content()), job_.device);
  const int64_t per_epoch = steps_per_epoch(train_->batches_per_epoch(), train_->describe(), job_);
  total_steps_ = job_.train.steps ? *job_.train.steps : *job_.train.epochs * per_epoch;
  if (resumed_ && counters_.step > total_steps_) {
    throw Error(fmt::format("{}: the checkpoint is at step {}, past the job's last step {}",
                            job_.train.steps ? "train.steps" : "train.epochs", counters_.step,
                            total_steps_),
                "raise train.steps (or train.epochs) to continue the run, or resume from an "
                "earlier checkpoint (--resume FILE)");
  }
  require_best_evaluations(job_, total_steps_);  // an epochs job's steps known now
  if (!resumed_at_end()) open_run_dir();         // last: input refused above leaves it untouched
  note("data: " + source_->describe());
  if (opt_->has_ema()) {
    note(
        fmt::format("optimizer.ema: an average of the weights, decay {}{}; the evaluations{} "
                    "are of it, and checkpoints keep it",
                    *job_.optimizer.ema.decay,
                    job_.optimizer.ema.warmup ? " (ramped up from the first steps)" : "",
                    samples_ ? " and samples" : ""));
  }
  for (const std::string& line : groups_.lines()) note(line);
  if (monitor_ && !monitor_->note().empty()) note(monitor_->note());
  if (job_.model.init_from) {
    note(resumed_ ? "model.init_from: not used, the run resumed from its checkpoint" : init_note_);
  }
}

// Collective, after start-up was agreed: the device communicator (gradients on the
// GPU travel over NCCL, also at world 1 when the job asks for it: the same code path,
// testable on one GPU), the gradient buckets and the buffer average; then the
// all-reduce algorithm of each bucket: the job's, or with `auto` the fastest per
// bucket-size class measured now on this world (every rank gets the same table).
void TrainSession::connect(dist::Watchdog* watchdog) {
  if (job_.device.is_cuda() && (comm_.size() > 1 || job_.comm.backend == CommBackend::nccl)) {
    device_comm_ = dist::make_nccl_communicator(comm_, job_.device, job_.comm.ranks_per_node);
    if (watchdog != nullptr) watchdog->add(*device_comm_);
  }
  grad_comm_ = device_comm_ ? device_comm_.get() : &comm_;
  if (job_.parallel.pipeline > 1 || job_.parallel.tensor > 1) {  // gradients over the data group
    grid_ = std::make_unique<dist::ProcessGrid>(comm_, dist::degrees_of(job_.parallel));
    grad_comm_ = &grid_->group(dist::Axis::data);
  }
  if (grid_) {  // the checkpoint savers, writers first in the order of their ranges
    const bool compressed = job_.compress.method != CompressMethod::none;
    save_comm_ = comm_.split(writes_range(coord_) || compressed ? 0 : 1, save_index());
    if (watchdog != nullptr) watchdog->add(*save_comm_);
  }
  if (tensor_split()) {
    dist::Communicator& tensor = grid_->group(dist::Axis::tensor);
    if (watchdog != nullptr) watchdog->add(tensor);
    tp_group_->attach(tensor);
    note(fmt::format("tensor parallel: {} ranks; this is tensor rank {}, holding\n{}",
                     tensor.size(), tensor.rank(),
                     graph::format_tensor_plan(model_.graph, tp_plan_)));
  }
  if (job_.parallel.pipeline > 1) {  // stages talk over the pipeline group
    dist::Communicator& pipe = grid_->group(dist::Axis::pipeline);
    if (watchdog != nullptr) watchdog->add(pipe);
    pipeline_ = std::make_unique<PipelineStage>(model_.graph, *ex_, stages_, pipe,
                                                job_.parallel.schedule, micro_batches_);
    pipeline_->set_trace([this](const std::string& name, const std::string& category, double start,
                                double secs, uint64_t bytes) {
      Profiler* p = profiler();
      if (p == nullptr || !p->attached()) return;
      const bool exchange = category == "exchange";
      const int track = exchange ? Profiler::kExchangeTrack : Profiler::kPipelineTrack;
      p->name_track(track, exchange ? "pipeline exchanges" : "pipeline micro-batches");
      const double t0 = p->from_steady(start);
      nlohmann::json args = {{"stage", pipeline_->stage()}};
      if (exchange) args["bytes"] = bytes;
      p->span(name, category, track, t0, t0 + secs, std::move(args));
    });
    tied_->connect(pipe);  // collective over the pipeline group
    if (watchdog != nullptr && tied_->comm() != nullptr) watchdog->add(*tied_->comm());
    note(fmt::format(
        "pipeline: {} stages, schedule {}, {} micro-batch(es) of {}; this is stage "
        "{}\n{}",
        stages_.size(), to_string(job_.parallel.schedule), micro_batches_, job_.data.micro_batch,
        pipeline_->stage(), graph::format_stages(model_.graph, stages_)));
  }
  weights_->attach(*grad_comm_);
  if (zero_params_) zero_params_->attach(*grad_comm_);
  std::vector<dist::GradRange> ranges;
  for (const graph::FlatEntry& e : weights_->layout())
    ranges.push_back({e.offset, e.spec.shape.numel()});
  // A stage sums its own parameters' gradients only (the rest are zeros), and frozen
  // ones stay home (but in a pipeline stage under ZeRO-2, whose buckets hold whatever
  // its backward writes).
  bool every_param = true;
  std::vector<dist::Bucket> planned = gradient_buckets(
      weights_->layout(), model_.graph, groups_,
      pipeline_ ? &stages_[static_cast<size_t>(pipeline_->stage())] : nullptr, zero2_ && pipeline_,
      static_cast<size_t>(job_.comm.bucket_mb * 1024.0 * 1024.0), &every_param);
  // ZeRO with optimizer.freeze: a step changes only what the buckets send, so only that
  // is gathered after it.
  const ShardRange& shard = weights_->shard();
  if (groups_.any_frozen() && !every_param && shard.sharded())
    weights_->set_cover(bucket_cover(planned, shard.base, shard.base + shard.span));
  std::vector<std::pair<int64_t, int64_t>> owners;  // ZeRO: every rank's range
  for (int r = 0; weights_->shard().sharded() && r < grad_comm_->size(); ++r) {
    const ShardRange& mine = weights_->shard();
    const ShardRange s = shard_of(mine.span, r, grad_comm_->size(), mine.base);
    owners.emplace_back(s.begin, s.end);
  }
  const std::vector<dist::Bucket> buckets = planned;
  if (zero2_) {
    auto zero = std::make_unique<dist::ShardedGradSync>(
        *grad_comm_, std::move(planned), ranges, owners, shard_grads_,
        every_param ? dist::Unbucketed::refused : dist::Unbucketed::skipped);
    ex_->set_grad_storage([this, shards = zero.get()](int p) {
      return shards->grad_view(p, weights_->layout()[static_cast<size_t>(p)].spec.shape);
    });
    grad_sync_ = std::move(zero);
  } else {
    auto sync = std::make_unique<dist::GradSync>(
        *grad_comm_, std::move(planned), ex_->grads().size(),
        job_.comm.overlap ? dist::Overlap::on : dist::Overlap::off,
        every_param ? dist::Unbucketed::refused : dist::Unbucketed::skipped);
    sync_ = sync.get();
    grad_sync_ = std::move(sync);
    sync_->set_accumulation(weights_->grads(), grad_acc_);
    // ZeRO-1: each bucket's parts are reduced into their owners (a reduce-scatter's
    // volume) instead of all-reduced: a rank steps only its range.
    if (weights_->shard().sharded()) sync_->set_owners(owners);
    if (job_.compress.method != CompressMethod::none) connect_compression(buckets);
  }
  if (!resumed_compression_.empty()) {  // connect_compression did not take it
    std::string names;
    for (const NamedTensor& t : resumed_compression_)
      names += fmt::format("{}{}", names.empty() ? "" : ", ", t.name);
    note(fmt::format(
        "note: the checkpoint holds gradient compression's state ({}), which this run "
        "without compress.method does not use: the gradient its error feedback still owed "
        "is dropped (resume with the checkpoint's compress settings to keep it)",
        names));
    resumed_compression_.clear();
    resumed_compression_.shrink_to_fit();
  }
  // The last parameter whose gradient is written (not zero pages, nor a frozen one ZeRO-2
  // keeps no storage for: the executor's zero_grads either way).
  int last_param = ex_->grads().size() - 1;
  while (last_param > 0 && !ex_->writes_grad(last_param)) --last_param;
  ex_->hooks.grad_ready = [this, last_param](int p) {
    if (inject_overflow_ && p == last_param) {  // DTRAIN_TEST_OVERFLOW, before the send
      Tensor g = ex_->grad_view(p).view(0, Shape{1});
      kernels::fill(g, std::numeric_limits<float>::infinity());
    }
    grad_sync_->ready(p);
  };
  buffer_avg_ = std::make_unique<BufferAverage>(ex_->buffers(), micro_batches_, *grad_comm_);

  choose_allreduce(buckets);
  if (grad_comm_->size() == 1) algo_summary_ = "none";  // one data-parallel rank: no sum
  if (grad_comm_->size() > 1) {
    note(fmt::format(
        "data parallel: {} ranks x {} micro-batch(es) of {}; {} gradient bucket(s) (closed at "
        "{} MB), all-reduce {} over {}, overlap {}",
        grad_comm_->size(), micro_batches_, job_.data.micro_batch, buckets.size(),
        job_.comm.bucket_mb, algo_summary_, grad_comm_->backend(),
        job_.comm.overlap ? "on" : "off"));
  }
  if (weights_->shard().sharded()) {
    const ShardRange& sh = weights_->shard();
    note(fmt::format(
        "ZeRO-{}: optimizer state{}{} sharded over {} ranks ({} elements each; {}, "
        "checkpoints saved by shard)",
        zero3_   ? 3
        : zero2_ ? 2
                 : 1,
        weights_->mode() == MasterMode::masters ? ", fp32 masters" : "",
        zero3_   ? ", gradients, parameters"
        : zero2_ ? ", gradients"
                 : "",
        sh.world, sh.block,
        zero3_ ? fmt::format("{} parameter blocks gathered before use", units_->units().size())
               : "parameters all-gathered after each step"));
  }
  bus_mark_ = grad_comm_->stats().bus_bytes;  // start-up's collectives are not a step's
}

bool TrainSession::writes_range(const dist::GridCoord& c) const {
  return (weights_->shard().sharded() && !tensor_split()) || c.dp == 0;
}

int TrainSession::save_index() const {
  if (job_.parallel.pipeline == 1 && job_.parallel.tensor == 1) return comm_.rank();
  // (writer first, stage, data rank, tensor rank): the order of save_comm_'s split.
  const auto order = [&](const dist::GridCoord& c) {
    const int key = (c.pp * job_.parallel.data + c.dp) * job_.parallel.tensor + c.tp;
    return (writes_range(c) ? 0 : comm_.size()) + key;
  };
  int index = 0;
  const dist::GridDegrees d = dist::degrees_of(job_.parallel);
  for (int r = 0; r < comm_.size(); ++r)
    index += order(dist::grid_coord(r, d)) < order(coord_) ? 1 : 0;
  return index;
}

// compress.method: each bucket goes through the compressor (src/compress) instead of
// the all-reduce, after compress.warmup_steps dense steps (train_step switches it on).
// Its all-reduces (the dense tensors, PowerSGD's P and Q) run comm.allreduce's
// algorithm, ring for auto (they are small and fixed); top-k's and 1-bit's all-gathers
// are the communicator's own.
void TrainSession::connect_compression(const std::vector<dist::Bucket>& buckets) {
  const AllreduceAlgo dense =
      job_.comm.allreduce == AllreduceAlgo::auto_ ? AllreduceAlgo::ring : job_.comm.allreduce;
  compression_ = std::make_unique<GradCompression>(
      job_.compress, groups_, weights_->layout(), buckets, *grad_comm_, *sync_,
      ex_->grads().buffer_elems(DType::f32), dense, counters_.seed, job_.device,
      std::vector<int64_t>{job_.parallel.pipeline, job_.parallel.data, job_.parallel.tensor,
                           coord_.pp, coord_.dp, coord_.tp});
  if (resumed_ && !compression_->restore(resumed_compression_)) {
    note(
        "note: the checkpoint holds no compression state for this layout (another world "
        "size, grid, method or optimizer.freeze list, or none): error feedback starts empty");
  } else if (resumed_ && !compression_->restored_server()) {
    note(
        "note: the checkpoint holds no server residual for these buckets (another "
        "comm.bucket_mb, or the gather exchange): the two-phase server residual starts empty");
  }
  resumed_compression_.clear();
  resumed_compression_.shrink_to_fit();
  note(compression_->describe(weights_->shard().sharded()));
}

void TrainSession::set_batch(const FeedBatch& b) {
  ex_->set_input(model_.input, b.input);
  ex_->set_input(model_.labels, b.labels);
}

StepTotals TrainSession::agree_totals(const StepTotals& local) {
  const std::array<double, 4> t =
      sum_over_ranks<4>(comm_, {local.loss_sum, local.labelled, local.stop, local.data_failed});
  return {t[0], t[1], t[2], t[3]};
}

// One optimizer step; returns the mean loss over the global batch's labels. Micro-batch
// m of rank r is the step's global micro-batch g = m * world + r (the sampler's order),
// whose samples are [g * micro_batch, (g + 1) * micro_batch) of the global batch.
double TrainSession::train_step(const StopSignals& signals) {
  Tensor grads = weights_->grads();
  if (compression_) compression_->begin_step(counters_.step);
  const DataPosition start = counters_.position;
  StepTotals local;
  if (pipeline_) {
    pipeline_passes(local);
  } else {
    sequential_passes(local);
  }
  grad_sync_->finish();
  if (tied_) tied_->sum(grads, weights_->layout());  // both parts, on the earlier stage
  buffer_avg_->finish();
  if (coord_.tp != 0) local.loss_sum = local.labelled = 0;  // tensor ranks share one loss
  local.stop = signals.requested() ? 1 : 0;
  local.data_failed = data_error_ ? 1 : 0;
  const StepTotals total = agree_totals(local);
  if (total.data_failed > 0) fail_training_data(start);
  stop_agreed_ = total.stop > 0;
  const double loss = total.labelled > 0 ? total.loss_sum / total.labelled : 0.0;
  // Unscale: the scaled sum over labels becomes the mean (no labels: a zero gradient).
  // The gradients stay scaled in memory: the norm is unscaled here, and the optimizer
  // reads each gradient times unscale x the clipping factor in its one pass. Every rank
  // holds the same summed gradient, so every rank finds the same overflow.
  const double unscale = total.labelled > 0 ? 1.0 / (total.labelled * scaler_.scale()) : 0.0;
  // Each rank counts the range it steps (runtime/zero.h): ZeRO's shard holds the sum
  // there only, a pipeline stage its span (a weight tied to a later stage counts on
  // the earlier one, which steps it); the norm adds the ranges', over every rank that
  // holds a distinct one. Tensor parallelism: split gradients add over the tensor group,
  // replicated ones count on one of its ranks.
  const Tensor own = own_grads();
  double sum_squares = tensor_split() ? tensor_sum_squares(own, weights_->layout(), coord_.tp == 0,
                                                           weights_->shard().begin)
                                      : optim::grad_sum_squares(own);
  if (weights_->shard().sharded()) {  // every rank's: data shards, stages, tensor parts
    sum_squares = sum_over_ranks<1>(comm_, {sum_squares})[0];
  } else {  // data replicas hold the same sums
    if (pipeline_)
      sum_squares = sum_over_ranks<1>(grid_->group(dist::Axis::pipeline), {sum_squares})[0];
    if (tensor_split())
      sum_squares = sum_over_ranks<1>(grid_->group(dist::Axis::tensor), {sum_squares})[0];
  }
  const double norm = std::sqrt(sum_squares) * unscale;
  const bool found_inf = !std::isfinite(loss) || !std::isfinite(norm);
  const precision::ScaleDecision d = scaler_.update(found_inf);
  if (compression_) compression_->adjust(d);
  ++counters_.step;
  counters_.scaler = scaler_.state();
  if (d.event == precision::ScaleEvent::fatal) fail_non_finite(loss);
  if (d.skip) {  // weights, optimizer state and buffers stay as the step found them
    buffer_avg_->discard();
    note(fmt::format("step {}: inf or nan in the gradients ({}); step skipped, loss scale {} -> {}",
                     counters_.step, first_non_finite(own_grads()), d.old_scale, d.new_scale));
    return loss;
  }
  if (d.event == precision::ScaleEvent::grew && rank_log_) {
    rank_log_->write(
        fmt::format("step {}: loss scale {} -> {}", counters_.step, d.old_scale, d.new_scale));
  }
  const double clip = job_.optimizer.clip_grad_norm
                          ? optim::clip_factor(norm, *job_.optimizer.clip_grad_norm)
                          : 1.0;
  // The schedule counts applied updates: a skipped step does not advance it.
  const double lr =
      optim::lr_at(job_.optimizer.schedule, job_.optimizer.lr, opt_->step_count(), total_steps_);
  {
    const Profiler::Scope span(profiler(), "optimizer", "optimizer",
                               {{"name", std::string(to_string(job_.optimizer.name))}});
    weights_->step(*opt_, lr, static_cast<float>(unscale * clip));
  }
  for (const std::string& name : groups_.frozen_names()) ++counters_.frozen_steps[name];
  if (tied_) tied_->publish(ex_->params());  // the earlier stage's step, to the later one
  return loss;
}

// A step's micro-batches one after another on this rank: each one's forward at its
// place in the global batch, its backward seeded with its label count times the loss
// scale, the gradient stage around it (grad_sync_: accumulating, or reducing each
// micro-batch into the shards), the buffers averaged around the forwards.
void TrainSession::sequential_passes(StepTotals& local) {
  const int64_t mb = job_.data.micro_batch;
  for (int m = 0; m < micro_batches_; ++m) {
    const FeedBatch& b = next_batch();
    set_batch(b);
    buffer_avg_->begin_micro(m);
    const auto g = static_cast<uint64_t>(m * job_.parallel.data + coord_.dp);
    ex_->forward(graph::Mode::train, static_cast<uint64_t>(counters_.step), {g * mb, mb});
    grad_sync_->before_backward(m, micro_batches_);
    inject_overflow_ = m + 1 == micro_batches_ && overflows_.due(counters_.step + 1);
    // d loss = label count x loss scale: the sum over labels, scaled (undone below).
    ex_->backward(model_.loss,
                  static_cast<float>(static_cast<double>(b.labelled) * scaler_.scale()));
    if (zero_params_) zero_params_->end_pass();
    inject_overflow_ = false;
    prefetch_batch();  // the next batch moves while this one computes
    local.loss_sum += read_scalar(ex_->value(model_.loss)) * static_cast<double>(b.labelled);
    local.labelled += static_cast<double>(b.labelled);
    buffer_avg_->end_micro(m);
    counters_.position = b.next;
    grad_sync_->after_backward(m, micro_batches_);
  }
}

// A pipeline step's forward and backward passes (runtime/pipeline.h): the same per
// micro-batch work as sequential_passes, in the schedule's order. Each micro-batch's
// inputs are copied (a schedule holds several while the feed moves on); buffers are
// averaged around each forward; the gradient stage runs around each backward as in
// sequential_passes (backwards run in micro-batch order, so the sums are the same).
void TrainSession::pipeline_passes(StepTotals& local) {
  const int64_t mb = job_.data.micro_batch;
  labelled_.assign(static_cast<size_t>(micro_batches_), 0);
  PipelineStage::StepHooks hooks;
  hooks.feed = [&](int m) {
    const FeedBatch& b = next_batch();
    const auto copy = [&](const Tensor& t) {
      Tensor c = Tensor::empty(t.shape(), t.dtype(), &kernels::device_allocator(job_.device));
      kernels::copy(t, c);
      return c;
    };
    ex_->set_input(model_.input, copy(b.input));
    ex_->set_input(model_.labels, copy(b.labels));
    labelled_[static_cast<size_t>(m)] = b.labelled;
    counters_.position = b.next;
    prefetch_batch();
    buffer_avg_->begin_micro(m);
    const auto g = static_cast<uint64_t>(m * job_.parallel.data + coord_.dp);
    return graph::BatchKey{g * static_cast<uint64_t>(mb), mb};
  };
  hooks.after_forward = [&](int m) { buffer_avg_->end_micro(m); };
  hooks.dloss = [&](int m) {
    return static_cast<float>(static_cast<double>(labelled_[static_cast<size_t>(m)]) *
                              scaler_.scale());
  };
  hooks.before_backward = [&](int m) {
    grad_sync_->before_backward(m, micro_batches_);
    inject_overflow_ = m + 1 == micro_batches_ && overflows_.due(counters_.step + 1);
  };
  hooks.after_backward = [&](int m) {
    inject_overflow_ = false;
    if (pipeline_->last()) {  // the loss and its labels are the last stage's
      const auto n = static_cast<double>(labelled_[static_cast<size_t>(m)]);
      local.loss_sum += read_scalar(ex_->value(model_.loss)) * n;
      local.labelled += n;
    }
    // Only this stage's gradients change (its buckets: its parameters and a tied copy);
    // the rest of the layout is the other stages' and never summed here.
    grad_sync_->after_backward(m, micro_batches_);
  };
  pipeline_->train_step(static_cast<uint64_t>(counters_.step), model_.loss, hooks);
}

// The gradient of the range this rank steps, summed: all of it, with ZeRO its shard
// (ZeRO-2 keeps nothing else; ZeRO-1's other ranges hold this rank's own part only), in
// a pipeline its stage's span (or its shard of it).
Tensor TrainSession::own_grads() const {
  const Tensor grads = weights_->grads();
  const ShardRange& sh = weights_->shard();
  if (!sh.ranged() || zero2_) return grads;
  return grads.view(sh.begin, Shape{sh.size()});
}

// The first parameter (in flat order) whose gradient holds inf or nan, or "" when none.
std::string TrainSession::first_non_finite(const Tensor& grads) const {
  // ZeRO: `grads` is this rank's range [begin, end) of the layout (own_grads()).
  const int64_t base = weights_->shard().ranged() ? weights_->shard().begin : 0;
  const Tensor host = kernels::to_host(grads);
  const float* g = host.data<float>();
  for (const graph::FlatEntry& e : weights_->layout()) {
    const int64_t lo = std::max(e.offset, base);
    const int64_t hi = std::min(e.offset + e.spec.shape.numel(), base + grads.numel());
    for (int64_t x = lo; x < hi; ++x) {
      if (!std::isfinite(g[x - base])) {
        return fmt::format("first in {}, element {} = {}", e.name, x - e.offset, g[x - base]);
      }
    }
  }
  return weights_->shard().ranged() ? "not in this rank's range of the gradient"
                                    : "the loss itself";
}

// An overflow the scaler cannot absorb (no scaling, or a dynamic scale at its minimum).
void TrainSession::fail_non_finite(double loss) const {
  const std::string where = first_non_finite(own_grads());
  if (scaler_.mode() == LossScaleMode::none) {
    throw RunError(
        fmt::format("step {}: the loss is {} and the gradient holds inf or nan ({})",
                    counters_.step, loss, where),
        !list_checkpoints(ckpt_dir_).empty()
            ? "lower optimizer.lr, add optimizer.clip_grad_norm, or resume from an earlier "
              "checkpoint"
            : "lower optimizer.lr or add optimizer.clip_grad_norm");
  }
  throw RunError(fmt::format("step {}: inf or nan in the gradients ({}) with the loss scale "
                             "already at precision.loss_scale.min = {}",
                             counters_.step, where, scaler_.scale()),
                 "the model diverged, or precision.loss_scale.min is too high for its "
                 "gradients: lower optimizer.lr or loss_scale.min, or set loss_scale.on_min: "
                 "clamp to keep skipping");
}

int TrainSession::run(const StopSignals& signals, dist::Watchdog* watchdog) {
  if (resumed_at_end()) {  // a requeued or repeated resume
    std::error_code ec;
    const std::string kept =
        fs::exists(out_dir_ / "summary.json", ec)
            ? "metrics.jsonl and summary.json stay as they are"
            : "metrics.jsonl stays as it is (no summary.json: a stop signal ended the run "
              "at its last step before the summary)";
    if (counters_.step < total_steps_) {
      note(fmt::format(
          "the run stopped early at step {} of {}: {} evaluation(s) without a gain in test {} "
          "(train.best.patience {}); nothing left to train, {}; raise train.best.patience (or "
          "set it to 0) to continue it",
          counters_.step, total_steps_, counters_.best->stale_evals, counters_.best->metric,
          job_.train.best.patience, kept));
    } else {
      note(fmt::format(
          "the checkpoint is the run's last step ({} of {}): nothing left to train, {}; raise "
          "train.steps (or train.epochs) to continue it",
          counters_.step, total_steps_, kept));
    }
    return 0;
  }
  connect(watchdog);
  if (resumed_ && leader()) set_aside_later_checkpoints();  // every rank has started
  start_best();
  const Clock::time_point start = Clock::now();
  const int64_t first = counters_.step;
  const int64_t log_every = std::max<int64_t>(job_.train.log_every, 1);
  // The window's losses live in counters_ (window_loss_sum, window_losses): a checkpoint
  // keeps them, so the first line after a resume is the uninterrupted run's.
  double window_wait = train_->wait_seconds();
  int64_t window_steps = 0;
  Clock::time_point window_start = Clock::now();
  double window_excluded = 0;  // seconds of the window spent evaluating or saving
  // The window's line: its mean loss, time per step (evaluations and saves excluded)
  // and data wait.
  const auto log_window_line = [&] {
    const double secs =
        (seconds_since(window_start) - window_excluded) / static_cast<double>(window_steps);
    window_excluded = 0;
    const int64_t n = counters_.window_losses;
    log_window(n > 0 ? counters_.window_loss_sum / static_cast<double>(n) : NAN, secs,
               (train_->wait_seconds() - window_wait) / static_cast<double>(window_steps),
               window_steps);
    counters_.window_loss_sum = 0;
    counters_.window_losses = 0;
    window_steps = 0;
    window_wait = train_->wait_seconds();
    window_start = Clock::now();
  };
  // A checkpoint whose evaluations have already spent this job's patience (a run
  // extended past its end, or resumed with less patience) ends here as an early stop, as
  // the uninterrupted run with this job would have ended at that evaluation.
  // Cleared first: every save below is of an evaluated step (the early stop's too).
  const bool eval_pending = std::exchange(counters_.eval_pending, false);
  bool stopped_early = resumed_ && patience_spent();
  if (stopped_early) {
    counters_.best->stopped = true;
    last_eval_ = evaluate();  // the checkpoint's weights evaluated, for the summary
    save_checkpoint();        // the same step again, now saying it stopped: a resume is done
  }
  // A checkpoint saved before its step's evaluation (fail_evaluation): that evaluation
  // first, then the step's save again, as the uninterrupted run did there. At the last
  // step it is the final evaluation below.
  bool pending = !stopped_early && eval_pending && counters_.step < total_steps_;
  while (!stopped_early && (pending || counters_.step < total_steps_)) {
    dist::TracedBuckets* traced = nullptr;
    if (grad_comm_->size() > 1) traced = grad_sync_.get();
    if (!pending) {
      const int64_t next = counters_.step + 1;
      if (profile_) profile_->before(next, *ex_, traced);
      {
        const Profiler::Scope span(profiler(), profiler() ? fmt::format("step {}", next) : "",
                                   "step");  // no formatting per step outside a profile
        counters_.last_loss = train_step(signals);
      }
      if (profile_) {
        const std::string written =
            profile_->after(next, stop_agreed_ || next == total_steps_, traced);
        if (!written.empty()) note(written);
      }
      note_steps_done(counters_.step);
      faults_.after_step(counters_.step);
      if (std::isfinite(counters_.last_loss)) {  // a skipped step's may be inf: not averaged
        counters_.window_loss_sum += counters_.last_loss;
        ++counters_.window_losses;
      }
      ++window_steps;
      if (counters_.step % log_every == 0 || counters_.step == total_steps_) log_window_line();
    }
    const int64_t s = counters_.step;
    const auto& ck = job_.train.checkpoint;
    const Clock::time_point aside = Clock::now();
    bool best_now = false;  // this step's evaluation is the best so far (train.best)
    bool early = false;     // and the run ends here (train.best.patience)
    if (job_.train.eval_every && s % *job_.train.eval_every == 0 && s != total_steps_) {
      const EvalResult r = evaluate();
      best_now = track_best(r);
      log_eval(r);
      early = patience_spent();
    }
    if (early) {  // ended like the last step: its window logged, its profile written, a
                  // stop signal now stops nothing more
      counters_.best->stopped = true;           // kept by the checkpoint: a resume trains nothing
      window_excluded += seconds_since(aside);  // the evaluation is not training time
      // A resumed pending evaluation trained no step here: its window's steps are the
      // checkpoint's (the times of that line are not the uninterrupted run's).
      if (window_steps == 0) window_steps = counters_.window_losses;
      if (window_steps > 0) log_window_line();
      if (profile_) {
        const std::string written = profile_->after(s, true, traced);
        if (!written.empty()) note(written);
      }
    }
    // Not once a stop is agreed: the checkpoint comes first (a grace period is short).
    if (samples_ && !stop_agreed_ && !early && s % job_.logging.samples.every == 0) log_samples();
    const bool save =
        (ck.every && s % *ck.every == 0 && s != total_steps_) || best_now || early || pending;
    pending = false;
    if (save) save_checkpoint();
    if (best_now) record_best();  // once its checkpoint is complete
    if (!early) window_excluded += seconds_since(aside);
    if (stop_agreed_ && !early) {
      if (leader() && !req_.stop_file.empty()) {
        std::ofstream(req_.stop_file) << "stopping\n";  // best effort: a resend is harmless
      }
      if (!save) save_checkpoint();
      comm_.barrier();     // no rank exits (and has the launcher end the job) before the save
      write_run_report();  // the run so far
      note(signals.requested()
               ? fmt::format("signal {} (SIG{}{}) received: checkpoint saved at step {} in {}; "
                             "resume with --resume latest",
                             signals.signal(), sigabbrev_np(signals.signal()),
                             signals.signal() == SIGUSR1 && dist::launcher_world_size()
                                 ? ": the --nproc launcher's or the scheduler's stop"
                                 : "",
                             s, ckpt_dir_.string())
               : fmt::format("another rank received a stop signal: checkpoint saved at step {} "
                             "in {}; resume with --resume latest",
                             s, ckpt_dir_.string()));
      return kExitInterrupted;
    }
    if (early) {
      stopped_early = true;
      break;
    }
  }
  if (!stopped_early) {  // an early stop evaluated and saved its last step already
    const EvalResult r = evaluate();
    // The last step's evaluation may be the best; it counts for patience only where it
    // falls on the train.eval_every grid, as the longer run's evaluation there would.
    const bool on_grid = job_.train.eval_every && counters_.step % *job_.train.eval_every == 0;
    const bool best_now = track_best(r, on_grid);
    log_eval(r);
    save_checkpoint();
    if (best_now) record_best();
  }
  const double secs = seconds_since(start);
  const nlohmann::json summary = this->summary(secs, first, counters_.last_loss);
  comm_.barrier();
  if (!leader()) return 0;
  if (metrics_) metrics_->write(summary);
  std::ofstream(out_dir_ / "summary.json") << summary.dump(2) << "\n";
  write_run_report();
  progress_.print(fmt::format("done: {} steps in {}, test {}accuracy {:.2f}%, output in {}",
                              counters_.step, format_duration(secs),
                              language_model_ ? "token " : "", 100 * last_eval_.accuracy,
                              out_dir_.string()));
  if (stopped_early) {
    const BestEval& b = *counters_.best;
    progress_.print(fmt::format(
        "stopped early at step {} of {}: the test {} has not improved by more than {} in {} "
        "evaluation(s) (train.best.patience); the best, {:.4f}, was at step {}{}",
        counters_.step, total_steps_, b.metric, job_.train.best.min_delta, b.stale_evals,
        b.metric == "loss" ? b.loss : b.accuracy, b.step,
        job_.train.best.keep_checkpoint ? "; --checkpoint best reads its checkpoint" : ""));
  }
  // A run that mostly skipped its updates still exits 0; it must not look like a good one.
  const int64_t skipped = scaler_.state().skipped_steps;
  if (skipped > 0 && 2 * skipped >= counters_.step) {
    const bool fixed = scaler_.mode() == LossScaleMode::static_;
    std::fprintf(stderr,
                 "dtrain: warning: %lld of the run's %lld steps were skipped (inf or nan "
                 "gradients), so the weights changed in %lld steps only; %s\n",
                 static_cast<long long>(skipped), static_cast<long long>(counters_.step),
                 static_cast<long long>(counters_.step - skipped),
                 fixed ? "lower precision.loss_scale.init, or use loss_scale.mode: dynamic"
                       : "lower precision.loss_scale.init (the dynamic scale backs off from it "
                         "one overflow at a time) or optimizer.lr");
  }
  return 0;
}

void TrainSessionDeleter::operator()(TrainSession* s) const { delete s; }

TrainSessionPtr prepare_training(const TrainRequest& request, dist::Communicator& world) {
  return TrainSessionPtr(new TrainSession(request, world));
}

int run_training(TrainSession& session, const StopSignals& signals, dist::Watchdog* watchdog) {
  return session.run(signals, watchdog);
}

int train(const TrainRequest& request) {
  // Installed before start-up, so a signal while data loads is also a graceful stop.
  StopSignals signals;
  const std::unique_ptr<dist::Communicator> self = dist::make_self_communicator();
  TrainSession session(request, *self);
  return session.run(signals, nullptr);
}

}  // namespace dtrain::runtime
