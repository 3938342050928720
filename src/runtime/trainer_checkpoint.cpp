// TrainSession's checkpoint side (runtime/train_session.h): model.init_from, resuming
// from any layout's checkpoint, and the saves of every layout (a file, a ZeRO or
// pipeline range by shard, tensor-parallel parts of the one-rank model).
#include <algorithm>
#include <cstring>
#include <map>

#include "runtime/train_session.h"

namespace dtrain::runtime {

// model.init_from: the weights (and batch-norm statistics) of a safetensors file under
// the family's reference names replace the seeded ones; the optimizer starts fresh. Only
// a fresh run reads it: the constructor calls this when resume_if_asked found nothing.
void TrainSession::init_from(const std::string& path) {
  require_init_from_supported(job_);
  InitWeights w;
  try {  // streamed, a tensor at a time: no f32 copy of the whole model on any rank
    w = load_init_weights(
        path, job_.model.arch, model_.graph.param_layout(), model_.graph.buffer_layout(),
        [this](int64_t lo, const Tensor& values) { weights_->load_piece(lo, values); });
  } catch (const Error& e) {
    throw Error("model.init_from: " + e.message(), e.hint());
  }
  weights_->finish_load();
  if (w.buffers.defined()) {
    Tensor live = ex_->buffers().flat(DType::f32);
    DTRAIN_CHECK(live.defined() && live.numel() == w.buffers.numel(),
                 "init_from: buffers of {} elements for a store of {}", w.buffers.numel(),
                 live.defined() ? live.numel() : 0);
    kernels::copy(w.buffers, live);
  }
  init_note_ = fmt::format("initialised from {} ({} tensors)", path, w.tensors);
  // A fine-tuning start: say which head tensors were not carried over, as Hugging Face does.
  const auto names = [](const std::vector<std::string>& v) {
    constexpr size_t kShown = 8;
    std::string s;
    for (size_t i = 0; i < std::min(v.size(), kShown); ++i) s += (i ? ", " : "") + v[i];
    return v.size() > kShown ? fmt::format("{} and {} more", s, v.size() - kShown) : s;
  };
  if (!w.fresh.empty()) {
    init_note_ += fmt::format(
        "; {} head tensor(s) start from the seed (not in the file, or shaped differently "
        "there): {}",
        w.fresh.size(), names(w.fresh));
  }
  if (!w.unused.empty()) {
    init_note_ += fmt::format("; {} head tensor(s) of the file not used: {}", w.unused.size(),
                              names(w.unused));
  }
  std::vector<std::string> seeded_frozen;  // a head the file lacks, frozen: random for good
  for (const std::string& n : w.fresh)
    if (groups_.frozen(n) || groups_.frozen_reference(n)) seeded_frozen.push_back(n);
  if (!seeded_frozen.empty()) {
    init_note_ += fmt::format(
        "\nwarning: optimizer.freeze keeps {} tensor(s) the file does not hold at their seeded "
        "values for the whole run: {} (leave them out of optimizer.freeze to train them)",
        seeded_frozen.size(), names(seeded_frozen));
  }
}

// Tensor parallelism: the checkpoint holds the one-rank model's layout; every rank
// streams it piece by piece (parameters and each optimizer state buffer) and keeps its
// parts, holding its own local layout only, never the whole model: each optimizer
// buffer only the range this rank steps (ZeRO's shard, a pipeline stage's span), the
// parameters whole (every rank uses them all), or under ZeRO-3 its shard of them.
TrainCounters TrainSession::resume_whole(const fs::path& file) {
  const int64_t elems = ex_->grads().buffer_elems(DType::f32);
  const ShardRange& sh = weights_->shard();
  const int64_t base = sh.ranged() ? sh.begin : 0;
  const auto zeros = [](int64_t n) {
    Tensor t = Tensor::empty(Shape{n}, DType::f32);
    kernels::fill(t, 0.0f);
    return t;
  };
  const int64_t param_base = zero3_ ? sh.begin : 0;
  Tensor params = zeros(zero3_ ? sh.size() : elems);
  std::map<std::string, Tensor> state;  // each optimizer buffer's range in the local layout
  for (const auto& [name, t] : opt_->state().buffers)
    state.emplace(name, zeros(sh.ranged() ? sh.size() : elems));
  RangeLoad load;
  load.layout = &whole_layout_;
  load.begin = 0;
  load.end = graph::FlatStore(whole_layout_).buffer_elems(DType::f32);
  load.params = [&](int64_t lo, const Tensor& piece) {
    whole_range_to_local(piece, lo, whole_layout_, weights_->layout(), params, param_base);
  };
  load.state = [&](const std::string& name, int64_t lo, const Tensor& piece) {
    whole_range_to_local(piece, lo, whole_layout_, weights_->layout(), state.at(name), base);
  };
  load.buffers = &ex_->buffers();
  load.opt = opt_.get();  // its options are checked; it takes the step
  take_extra_blobs(load);
  const TrainCounters counters = load_train_state_ranges(file, load);
  weights_->load_piece(param_base, params);
  // ZeRO or a pipeline stage: this rank's optimizer holds its range [begin, end) of the
  // local layout, as `state` does.
  optim::OptimizerState mine = opt_->state();
  for (auto& [name, t] : mine.buffers) t = state.at(name);
  opt_->load_state(mine);
  return counters;
}

// The classes an image folder's checkpoint was trained on against data.path's now: a
// renamed, added or removed class directory moves the labels (positions in byte order).
void TrainSession::check_resumed_classes(const fs::path& file) const {
  const std::string mismatch = class_mismatch(counters_.classes, source_->class_names());
  if (mismatch.empty()) return;
  throw Error(fmt::format("{}: {}", file.string(), mismatch),
              "labels are the class directories' positions in byte order: restore the "
              "directories the run trained on, or start a new run");
}

// optimizer.ema after a resume: an average the checkpoint lacks starts again from the
// resumed weights (the constructor starts it); one the job no longer keeps is not read.
void TrainSession::resumed_ema_note(const fs::path& file) {
  opt_->set_ema_ready(counters_.ema);
  if (opt_->has_ema() && !counters_.ema) {
    note(
        fmt::format("note: {} holds no average of the weights (optimizer.ema): it starts from "
                    "the weights of step {}",
                    file.string(), counters_.step));
  } else if (!opt_->has_ema() && counters_.ema) {
    note(
        fmt::format("note: {} holds an average of the weights that this job does not keep "
                    "(optimizer.ema.decay unset): it is not read, and the next checkpoints "
                    "have none",
                    file.string()));
  }
}

// Compression's state comes from this rank's shard (its index in the save's group),
// kept until connect_compression restores it.
void TrainSession::take_extra_blobs(RangeLoad& load) {
  load.rank = save_index();
  load.world = comm_.size();
  load.extra = [this](const std::vector<const NamedTensor*>& blobs) {
    for (const NamedTensor* t : blobs) resumed_compression_.push_back(*t);
  };
}

void TrainSession::resume_if_asked() {
  if (req_.resume) {
    const fs::path file = resolve_resume(*req_.resume, ckpt_dir_);
    if (!file.empty()) {
      const std::string hash = counters_.config_hash, yaml = counters_.job_yaml;
      const int64_t heads = counters_.heads;  // this job's: the next saves record it
      // Any layout's checkpoint (a file, or a sharded directory of any world size):
      // every parameter piece, and this rank's range of the optimizer state; tensor
      // parallelism takes its parts of the one-rank model.
      RangeLoad load;
      load.layout = &weights_->layout();
      load.begin = weights_->shard().begin;
      load.end = weights_->shard().end;
      load.params = [this](int64_t lo, const Tensor& piece) { weights_->load_piece(lo, piece); };
      load.buffers = &ex_->buffers();
      load.opt = opt_.get();
      take_extra_blobs(load);
      counters_ = tensor_split() ? resume_whole(file) : load_train_state_ranges(file, load);
      weights_->finish_load();
      resumed_ema_note(file);
      // The head count is the one part of the model no tensor's shape shows.
      if (counters_.heads > 0 && heads > 0 && counters_.heads != heads) {
        throw Error(fmt::format("{}: the model was trained with {} attention heads, the job's "
                                "model.heads is {}",
                                file.string(), counters_.heads, heads),
                    fmt::format("set model.heads: {} (the same weights split into other heads "
                                "are another model)",
                                counters_.heads));
      }
      counters_.heads = heads;
      if (counters_.config_hash != hash) {
        // The settings this run changes, where the checkpoint keeps its job; else only
        // that they differ (another job file, --set, or a dtrain with other keys).
        const std::string changed =
            counters_.job_yaml.empty() ? std::string() : changed_settings(counters_.job_yaml, yaml);
        note(changed.empty()
                 ? fmt::format("note: {} was written with other settings (another job file or "
                               "--set, or a dtrain whose settings had other keys); the model "
                               "matches, so training continues with this job's settings",
                               file.string())
                 : fmt::format("note: this run's settings differ from those {} was written "
                               "with: {}; the model matches, so training continues with this "
                               "run's",
                               file.string(), changed));
        counters_.config_hash = hash;
      }
      counters_.job_yaml = yaml;
      if (counters_.scaler) scaler_.load(*counters_.scaler);
      check_resumed_classes(file);
      // An epoch is cut into whole steps of data.global_batch samples; a position inside
      // one (a checkpoint of an older dtrain, which cut epochs by micro-batches, or of
      // another global batch) moves on to the next step's start.
      if (const int64_t inside = counters_.position.offset % job_.data.global_batch; inside) {
        const int64_t skip = job_.data.global_batch - inside;
        note(
            fmt::format("note: {}'s data position (epoch {}, sample {}) is inside a step of {} "
                        "samples; the run goes on from the next step's start, {} samples on",
                        file.string(), counters_.position.epoch, counters_.position.offset,
                        job_.data.global_batch, skip));
        counters_.position.offset += skip;
      }
      note(fmt::format(
          "resumed from {} at step {}{}", file.string(), counters_.step,
          tensor_split() ? fmt::format(" (tensor rank {} takes its parts)", coord_.tp) : ""));
      resumed_ = true;
      // On disk where this run saves (not --resume PATH from elsewhere): a failure before
      // the next step need not save it again.
      std::error_code same;
      if (fs::equivalent(file.parent_path(), ckpt_dir_, same)) saved_step_ = counters_.step;
    } else {
      note("no checkpoint yet; starting from step 0");
    }
    return;
  }
  // A fresh run beside an earlier run's checkpoints would prune its own (theirs have the
  // higher steps) and a later --resume latest would take theirs: refused.
  const std::vector<fs::path> earlier = list_checkpoints(ckpt_dir_);
  if (!earlier.empty()) {
    throw Error(fmt::format("{}: holds {} checkpoint(s) of an earlier run (the newest {}); a "
                            "fresh run would mix its checkpoints with them",
                            ckpt_dir_.string(), earlier.size(), earlier.back().filename().string()),
                "continue that run with --resume latest, or give this one another "
                "run.output_dir (or train.checkpoint.dir), or remove the old checkpoints");
  }
}

// Resuming from an earlier checkpoint than the directory's newest abandons the run that
// went on from it: its later checkpoints move to ckpt_dir/abandoned/from-step-N/ (kept,
// and a later --resume latest takes this run's own, not theirs). Called by the leader once
// every rank has started (input refused at start-up leaves the directory as it was).
void TrainSession::set_aside_later_checkpoints() {
  std::vector<fs::path> later;
  for (const fs::path& p : list_checkpoints(ckpt_dir_))
    if (step_of_name(p).value_or(-1) > counters_.step) later.push_back(p);
  if (later.empty()) return;
  fs::path aside = ckpt_dir_ / "abandoned" / fmt::format("from-step-{}", counters_.step);
  for (int n = 2; fs::exists(aside); ++n)
    aside = ckpt_dir_ / "abandoned" / fmt::format("from-step-{}-{}", counters_.step, n);
  std::error_code ec;
  fs::create_directories(aside, ec);
  for (const fs::path& p : later) {
    const fs::path to = aside / p.filename();
    if (!ec) fs::rename(p, to, ec);
    if (ec) {
      throw RunError(fmt::format("{}: cannot move it to {} ({}); it is a later checkpoint of "
                                 "the run this resume abandons",
                                 p.string(), to.string(), ec.message()),
                     "move or remove it yourself, so that a later --resume latest does not "
                     "take it");
    }
  }
  note(
      fmt::format("note: {} later checkpoint(s) of the run this one abandons (the newest "
                  "{}) moved to {}",
                  later.size(), later.back().filename().string(), aside.string()));
}

// Every rank first proves its replica equals rank 0's (parameters, buffers, optimizer
// state); rank 0 then writes. Its file is complete (renamed into place) when it returns.
// A rank that steps a range of the layout (ZeRO's shard, a pipeline stage's span, or
// the stage's shard) writes that range by shard (runtime/train_state.h: a step-N
// directory): every ZeRO rank, or one data replica of each stage; data replicas prove
// they agree first (a stage's all of it, ZeRO's the buffers). Tensor parallelism writes
// the one-rank model's layout by shard too (save_tensor_parts), and so do replicas
// with gradient compression (save_replica_parts: each rank's residual is its own).
void TrainSession::save_checkpoint() {
  saved_step_ = counters_.step;
  if (tensor_split()) {
    save_tensor_parts();
    return;
  }
  if (weights_->shard().ranged()) {
    save_by_shard();
    return;
  }
  graph::FlatStore& params = weights_->state();
  std::vector<Tensor> state = {params.flat(DType::f32), ex_->buffers().flat(DType::f32)};
  for (const auto& [name, t] : opt_->state().buffers) state.push_back(t);
  diverge_for_test(state[0], 0);
  agree_replicas(replica_mismatch(comm_, state, "parameters, buffers and optimizer state"));
  if (compression_) {
    save_replica_parts(state[0]);
  } else if (leader()) {
    const fs::path file = checkpoint_path(ckpt_dir_, counters_.step);
    save_train_state(file, params, ex_->buffers(), *opt_, counters_);
    prune();
  }
  weights_->release_state();
}

// Gradient compression leaves every rank a residual of its own (what it has not sent),
// so a replica's checkpoint is written by shard: each rank its part of the replicated
// parameters and optimizer state (shard_of, as ZeRO would split them) and its own
// residual, rank 0 the buffers and PowerSGD's Q. No rank holds another's residual (a
// single file would gather [world, layout] on rank 0), and the ranks write in parallel.
void TrainSession::save_replica_parts(Tensor params) {
  const int64_t total = ex_->grads().buffer_elems(DType::f32);
  const ShardRange part = shard_of(total, comm_.rank(), comm_.size());
  ShardedSave save;
  save.begin = part.begin;
  save.end = part.end;
  save.params = params.view(part.begin, Shape{part.size()});
  save.layout = &weights_->layout();
  save.total = total;
  save.opt = opt_.get();
  save.opt_base = 0;
  save.zero_stage = 0;
  save.extra = compression_blobs();
  write_shard(save);
}

// A range of the layout by shard: ZeRO's, or a pipeline stage's span (each stage's
// first data replica writes it, stage 0's shard carrying every stage's buffers).
void TrainSession::save_by_shard() {
  const ShardRange& sh = weights_->shard();
  dist::Communicator& data = pipeline_ ? grid_->group(dist::Axis::data) : comm_;
  std::vector<Tensor> replicated = {ex_->buffers().flat(DType::f32)};
  if (!sh.sharded()) {  // a stage's data replicas hold the same range
    replicated.push_back(weights_->shard_params());
    for (const auto& [name, t] : opt_->state().buffers) replicated.push_back(t);
  }
  if (!sh.sharded()) diverge_for_test(weights_->shard_params(), sh.begin);
  agree_replicas(replica_mismatch(
      data, replicated, sh.sharded() ? "buffers" : "parameters, buffers and optimizer state"));
  if (!sh.sharded() && coord_.dp != 0) {
    if (compression_) save_residual_only(weights_->layout(), ex_->grads().buffer_elems(DType::f32));
    return;
  }
  ShardedSave save;
  save.begin = sh.begin;
  save.end = sh.end;
  save.params = weights_->shard_params();
  save.layout = &weights_->layout();
  save.total = ex_->grads().buffer_elems(DType::f32);
  save.opt = opt_.get();
  save.zero_stage = sh.sharded() ? job_.parallel.zero_stage : 0;
  if (compression_) save.extra = compression_blobs();
  write_shard(save);
}

// Writes this rank's shard of a step-N directory (every field of `save` but the group,
// the buffers, the precision and the crash hook, which are the same for every sharded
// save). The buffers: the executor's, or in a pipeline a copy holding every stage's own
// on stage 0, the save's rank 0 (collective over data rank 0's pipeline group).
void TrainSession::write_shard(ShardedSave save) {
  graph::FlatStore buffers;
  save.buffers = &ex_->buffers();
  if (pipeline_ && coord_.dp == 0) {
    buffers = graph::FlatStore(ex_->buffers().entries());
    buffers.allocate(ex_->buffers().device());
    Tensor all = buffers.flat(DType::f32);
    if (all.defined()) {
      kernels::copy(ex_->buffers().flat(DType::f32), all);
      gather_to_first_stage(grid_->group(dist::Axis::pipeline), stages_,
                            {{all, &buffers.entries()}});
    }
    save.buffers = &buffers;
  }
  save.comm = save_comm_ ? save_comm_.get() : &comm_;
  save.precision = std::string(to_string(job_.precision.dtype));
  save.at_phase = [this](std::string_view phase) { save_faults_.at(counters_.step, phase); };
  save_sharded_state(sharded_checkpoint_path(ckpt_dir_, counters_.step), save, counters_);
  prune();
}

// Tensor parallelism: the one-rank model's layout written by shard: each stage's span
// of it (the whole model without a pipeline) divided among its tensor ranks, each
// range assembled on its owner from every tensor rank's parts (assemble_range; exact:
// every element comes from one rank) and written by it, on data rank 0. A rank hands
// in the range it steps (ZeRO's shard, a stage's span; else its whole local layout),
// never widened: with ZeRO the data group's shards are reduced into its rank 0 range by
// range. First the checks: data replicas hold the same state (with ZeRO the same
// buffers), and every tensor rank the same replicated entries (each computes them
// whole; compared as digests, which a data group's shards add up to). Any layout
// resumes it (resume_whole).
void TrainSession::save_tensor_parts() {
  const ShardRange& sh = weights_->shard();
  const int64_t base = sh.ranged() ? sh.begin : 0;
  std::vector<Tensor> state = {
      sh.ranged() ? weights_->shard_params() : weights_->state().flat(DType::f32),
      ex_->buffers().flat(DType::f32)};
  for (const auto& [name, t] : opt_->state().buffers) state.push_back(t);
  dist::Communicator& data = grid_->group(dist::Axis::data);
  diverge_for_test(state[0], base);
  std::string mismatch =
      sh.sharded() ? replica_mismatch(data, {state[1]}, "buffers")
                   : replica_mismatch(data, state, "parameters, buffers and optimizer state");
  std::vector<Tensor> owned = state;
  owned.erase(owned.begin() + 1);  // the buffers: checked above
  std::vector<int64_t> digests = replicated_digests(owned, weights_->layout(), base);
  Tensor digest =
      Tensor::wrap(digests.data(), Shape{static_cast<int64_t>(digests.size())}, DType::i64);
  if (sh.sharded() && !digests.empty()) data.all_reduce(digest);
  const std::string parts = replica_mismatch(grid_->group(dist::Axis::tensor), {digest},
                                             "replicated parameters and their optimizer state");
  agree_replicas(mismatch.empty() ? parts : mismatch);
  const int64_t total = graph::FlatStore(whole_layout_).buffer_elems(DType::f32);
  if (sh.sharded() || coord_.dp == 0) {
    RangeAssembly a;
    a.local_layout = &weights_->layout();
    a.whole_layout = &whole_layout_;
    a.replicated = coord_.tp == 0;
    a.local_base = base;
    a.span = total;
    if (pipeline_) {
      const auto [lo, hi] =
          stage_spans(whole_layout_, stages_, total)[static_cast<size_t>(coord_.pp)];
      a.base = lo;
      a.span = hi - lo;
    }
    a.options = job_.optimizer;
    a.segments = segments_of(whole_layout_, job_.optimizer.no_decay, groups_);
    a.step = opt_->step_count();
    const WholeRange mine =
        assemble_range(grid_->group(dist::Axis::tensor), sh.sharded() ? &data : nullptr, state, a);
    if (coord_.dp == 0) {
      ShardedSave save;
      save.begin = mine.range.begin;
      save.end = mine.range.end;
      save.params = mine.params;
      save.layout = &whole_layout_;
      save.total = total;
      save.opt = mine.opt.get();
      save.zero_stage = job_.parallel.zero_stage;
      if (compression_) save.extra = compression_blobs();
      write_shard(save);
    }
  }
  if (coord_.dp != 0 && compression_) save_residual_only(whole_layout_, total);
  if (!sh.ranged()) weights_->release_state();
}

// Gradient compression in a grid: a rank that writes no range of the layout still
// writes a shard, its range empty at the layout's end, with its residual and Q (its
// stage's and tensor rank's own: they differ from rank 0's).
void TrainSession::save_residual_only(const std::vector<graph::FlatEntry>& layout, int64_t total) {
  ShardedSave save;
  save.begin = total;
  save.end = total;
  save.params = Tensor::empty(Shape{0}, DType::f32);
  save.layout = &layout;
  save.total = total;
  save.opt = opt_.get();
  save.opt_base = total;  // none of its state
  save.zero_stage = job_.parallel.zero_stage;
  save.extra = compression_blobs();
  write_shard(save);
}

std::vector<NamedTensor> TrainSession::compression_blobs() const {
  return compression_->state(grid_ != nullptr || comm_.rank() == 0);
}

void TrainSession::agree_replicas(const std::string& mismatch) {
  const double failed = sum_over_ranks<1>(comm_, {mismatch.empty() ? 0.0 : 1.0})[0];
  if (failed == 0) return;
  throw RunError(
      fmt::format(
          "step {}: {}; this checkpoint was not written", counters_.step,
          mismatch.empty() ? "replicas diverged on another rank (its log names them)" : mismatch),
      "resume from the previous checkpoint (--resume latest); if the same rank diverges again, "
      "suspect its device or memory");
}

void TrainSession::diverge_for_test(Tensor params, int64_t base) {
  if (!save_faults_.diverges(counters_.step)) return;
  for (const graph::FlatEntry& e : weights_->layout()) {
    const int64_t x = std::max(e.offset, base);
    if (e.spec.split.split() ||
        x >= std::min(e.offset + e.spec.shape.numel(), base + params.numel()))
      continue;
    Tensor one = params.view(x - base, Shape{1});
    Tensor host = Tensor::empty(Shape{1}, DType::f32);
    kernels::copy(one, host);
    uint32_t bits = 0;
    std::memcpy(&bits, host.raw(), 4);
    bits ^= 1;
    std::memcpy(host.raw(), &bits, 4);
    kernels::copy(host, one);
    note(fmt::format("DTRAIN_TEST_SAVE_FAULT: {} element {} changed by one bit on this rank",
                     e.name, x - e.offset));
    return;
  }
}

}  // namespace dtrain::runtime
