// The training session behind runtime/trainer.h, private to src/runtime. Its members
// live in trainer.cpp (start-up, connecting the communicators, the step, the loop),
// trainer_data.cpp (reading the feeds: training batches, the evaluation, unreadable
// data), trainer_checkpoint.cpp (model.init_from, resume, the saves of every layout),
// trainer_log.cpp (the run directory, metrics, TensorBoard, the console and the
// summary), and trainer_best.cpp, trainer_require.cpp and trainer_samples.cpp.
#pragma once

#include <array>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/allocator.h"
#include "data/tokenizer.h"
#include "dist/allreduce.h"
#include "dist/ddp.h"
#include "dist/grid.h"
#include "dist/watchdog.h"
#include "dist/zero_grads.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "models/registry.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "precision/loss_scaler.h"
#include "runtime/checkpoint.h"
#include "runtime/data_feed.h"
#include "runtime/device_feed.h"
#include "runtime/estimate.h"
#include "runtime/faults.h"
#include "runtime/grad_compression.h"
#include "runtime/master_weights.h"
#include "runtime/metrics.h"
#include "runtime/monitor.h"
#include "runtime/param_groups.h"
#include "runtime/pipeline.h"
#include "runtime/profiler.h"
#include "runtime/replicas.h"
#include "runtime/report.h"
#include "runtime/roofline.h"
#include "runtime/safetensors.h"
#include "runtime/signals.h"
#include "runtime/startup.h"
#include "runtime/tensor_parallel.h"
#include "runtime/tensorboard.h"
#include "runtime/train_state.h"
#include "runtime/trainer.h"
#include "runtime/zero.h"
#include "runtime/zero_params.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
  bool ema = false;  // of optimizer.ema's average, not of the weights the optimizer steps
};

// Element-wise sums over the ranks (in double; one small all-reduce).
template <size_t N>
std::array<double, N> sum_over_ranks(dist::Communicator& comm, std::array<double, N> v) {
  if (comm.size() == 1) return v;
  Tensor t = Tensor::wrap(v.data(), Shape{static_cast<int64_t>(N)}, DType::f64);
  comm.all_reduce(t);
  return v;
}

// What one optimizer step adds up over every rank: the loss summed over labels,
// the label count, and how many ranks were asked to stop.
struct StepTotals {
  double loss_sum = 0, labelled = 0, stop = 0;
  double data_failed = 0;  // ranks that could not read a batch of the step
};

// `t` on the host as f32 (half logits widened: the accuracy count, a sample's draw).
Tensor host_f32(const Tensor& t);
// A one-element f32 tensor's value (a loss), on the host.
float read_scalar(const Tensor& t);

// Start-up refusals (trainer_require.cpp): the device and the world against the
// layout, then require_trainable; train.best's evaluations once the steps are known
// (an epochs job's from the data); and the estimated peak against the rank's memory
// (the estimate, for the summary).
void require_supported(const Job& job, int world);
void require_best_evaluations(const Job& job, int64_t total_steps);
MemoryEstimate require_fits(const Job& job);

class TrainSession {
 public:
  TrainSession(const TrainRequest& r, dist::Communicator& comm);
  int run(const StopSignals& signals, dist::Watchdog* watchdog);

 private:
  void open_run_dir();
  void resume_if_asked();
  void connect(dist::Watchdog* watchdog);
  void connect_compression(const std::vector<dist::Bucket>& buckets);
  // The all-reduce algorithm of each gradient bucket, given to sync_ (trainer_allreduce.cpp).
  void choose_allreduce(const std::vector<dist::Bucket>& buckets);
  double train_step(const StopSignals& signals);
  std::string first_non_finite(const Tensor& grads) const;
  Tensor own_grads() const;
  [[noreturn]] void fail_non_finite(double loss) const;
  // Resumed at the job's last step (a requeue after the end), or where it stopped early:
  // nothing to train or write.
  bool resumed_at_end() const {
    return resumed_ && !counters_.eval_pending &&
           (counters_.step == total_steps_ ||
            (counters_.best && counters_.best->stopped && patience_spent()));
  }
  // train.best (trainer_best.cpp): whether an evaluation is the best so far and its
  // checkpoint kept (counters_.best updated, with the patience count); whether the run
  // ends early; the checkpoints the rotation keeps for it; best.json after a save.
  bool track_best(const EvalResult& r, bool counts_for_patience = true);
  bool patience_spent() const;
  std::vector<int64_t> kept_best_steps() const;
  void prune();  // the rotation (leader): the newest train.checkpoint.keep and the best
  void record_best(std::string_view gone = {});  // gone: why a record is removed
  void start_best();
  StepTotals agree_totals(const StepTotals& local);
  // The test split's loss and accuracy: with optimizer.ema of the average (exchanged into
  // the model for the evaluation and back, every bit restored), else of the weights.
  // A test batch that cannot be read (a damaged image) on any rank ends the evaluation on
  // every rank (agreed batch by batch, before the batch's collectives): the checkpoint is
  // saved with the evaluation pending, unless this step's is already on disk, and the
  // failing rank's error ends the run (fail_evaluation).
  EvalResult evaluate();
  EvalResult evaluate_model(AgreedStatus& failed);
  [[noreturn]] void fail_evaluation(const AgreedStatus& failed);
  bool save_before_failing(bool eval_pending);
  void with_average(const std::function<void(bool average)>& work);
  void log_window(double loss, double seconds, double wait, int64_t steps);
  void log_eval(const EvalResult& r);
  // logging.samples (trainer_samples.cpp): the tokenizer and the prompt, read at start-up
  // (an Error there is the job's), then the samples of this step.
  void prepare_samples();
  void log_samples();
  void draw_samples(bool average);
  void trim_samples(int64_t keep_through) const;
  void write_run_report(bool quiet = false);  // quiet: no note when it cannot be drawn
  // The run's summary.json (collective in a pipeline: every stage's figures).
  nlohmann::json summary(double seconds, int64_t first_step, double last_loss);
  void save_checkpoint();
  void set_batch(const FeedBatch& b);
  void init_from(const std::string& path);
  void add_device_memory(nlohmann::json& line) const;
  nlohmann::json estimate_by_kind() const;
  bool leader() const { return comm_.rank() == 0; }
  void set_aside_later_checkpoints();
  void note(const std::string& line);  // rank 0's console, and this rank's log
  void publish(const nlohmann::json& line, std::string_view group);
  double gpu_peak_flops();  // cached in gpu_peak_
  Profiler* profiler() const { return profile_ ? profile_->profiler() : nullptr; }

  const TrainRequest& req_;
  const Job& job_;
  dist::Communicator& comm_;                         // the host world: agreement, totals, checks
  std::unique_ptr<dist::Communicator> device_comm_;  // NCCL for a GPU job across ranks
  dist::Communicator* grad_comm_ = nullptr;          // gradients and buffers: device_comm_ or comm_
  models::ModelGraph model_;
  ParamGroups groups_;  // optimizer.freeze and optimizer.layer_decay
  graph::DTypePolicy policy_;
  std::unique_ptr<graph::Executor> ex_;
  std::vector<graph::Stage> stages_;         // parallel.pipeline > 1: the stage plan
  std::unique_ptr<dist::ProcessGrid> grid_;  // pipeline x data groups (pipeline > 1)
  std::unique_ptr<PipelineStage> pipeline_;  // this rank's stage
  dist::GridCoord coord_;                    // this rank's place in the grid
  std::vector<int64_t> labelled_;            // per micro-batch of a pipeline step
  std::unique_ptr<TiedWeights> tied_;        // weights tied across stages (pipeline)
  // A grid's checkpoint writers, in the order of their ranges (stage, data rank, tensor
  // rank): every ZeRO rank of a pipeline, else data rank 0's; with gradient compression
  // every other rank after them, writing its residual only (without compression the
  // others hold a group they never use).
  std::unique_ptr<dist::Communicator> save_comm_;
  bool writes_range(const dist::GridCoord& c) const;
  // This rank's index in a save's group: save_comm_'s rank in a grid, else the world's;
  // a resume reads the extra blobs (compression's) of that index's shard.
  int save_index() const;
  std::shared_ptr<CommTensorGroup> tp_group_;   // parallel.tensor > 1: the split ops' group
  graph::TensorParallelPlan tp_plan_;           // what the pass split on this rank
  std::vector<graph::FlatEntry> whole_layout_;  // the one-rank model's fp32 layout
  bool tensor_split() const { return tp_group_ != nullptr; }
  // A pipeline stage after the first computes on what the stage before sends: its feeds
  // bring the labels (and label counts) alone.
  runtime::FeedContent feed_content() const {
    return job_.parallel.pipeline > 1 && coord_.pp > 0 ? FeedContent::labels : FeedContent::all;
  }
  void write_shard(ShardedSave save);
  void save_tensor_parts();
  // A save's replica checks (replica_mismatch), agreed by every rank: all of them fail
  // together, with the first message, or none does.
  void agree_replicas(const std::string& mismatch);
  // DTRAIN_TEST_SAVE_FAULT=<rank>:<step>:diverge: flips the last bit of the first
  // element of a replicated entry that `params` (elements [base, base + n) of the f32
  // layout) holds, before the save's checks.
  void diverge_for_test(Tensor params, int64_t base);
  void save_by_shard();
  void save_replica_parts(Tensor params);
  void save_residual_only(const std::vector<graph::FlatEntry>& layout, int64_t total);
  // Compression's blobs for this rank's shard: its residual and place, and PowerSGD's Q
  // on rank 0, or in a grid on every rank (each stage and tensor rank has its own).
  std::vector<NamedTensor> compression_blobs() const;
  TrainCounters resume_whole(const fs::path& file);
  void take_extra_blobs(RangeLoad& load);
  void check_resumed_classes(const fs::path& file) const;
  void resumed_ema_note(const std::filesystem::path& file);
  // The training feed's next batch; once a batch cannot be read (data_error_), a stand-in
  // of no labels for the rest of the step, so that every collective still runs. The step
  // is then discarded on every rank and its start saved (fail_training_data).
  const FeedBatch& next_batch();
  void prefetch_batch();
  const FeedBatch& standin_batch();
  // data.unreadable: skip: a warning per file (once per rank), and the count.
  void note_unreadable(const FeedBatch& b);
  [[noreturn]] void fail_training_data(const DataPosition& start);
  void sequential_passes(StepTotals& local);
  void pipeline_passes(StepTotals& local);
  std::unique_ptr<MasterWeights> weights_;  // what the optimizer steps, in each precision
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<DataSource> source_;
  std::unique_ptr<DeviceFeed> train_;
  std::exception_ptr data_error_;  // this rank's unreadable training batch
  std::set<std::string> unreadable_seen_;
  int64_t unreadable_skipped_ = 0;  // sample reads left out, training and evaluation
  FeedBatch standin_;
  // The step's gradient stage: DDP's buckets (ZeRO-1's reduce to owners, through the
  // compressor), or ZeRO-2's reduce into shards.
  std::unique_ptr<dist::StepGradients> grad_sync_;
  dist::GradSync* sync_ = nullptr;  // grad_sync_ when it is DDP's (algorithms, compression)
  bool zero2_ = false, zero3_ = false;
  std::unique_ptr<graph::ParamUnits> units_;    // ZeRO-3: the blocks gathered before use
  std::unique_ptr<ShardedParams> zero_params_;  // ZeRO-3: this rank's parameters
  Tensor shard_grads_;                          // ZeRO-2: this rank's shard of the summed gradient
  double bus_mark_ = 0;                         // grad_comm_'s bus bytes at the last logged window
  std::unique_ptr<BufferAverage> buffer_avg_;
  std::unique_ptr<GradCompression> compression_;  // compress.method, in GradSync's buckets
  std::vector<NamedTensor> resumed_compression_;  // its state from the checkpoint, if any
  Tensor grad_acc_;
  graph::FlatStore grad_acc_store_;  // a pipeline stage's grad_acc_: its held gradients
  bool language_model_ = false;
  TrainCounters counters_;
  int64_t total_steps_ = 0;
  int micro_batches_ = 1;
  bool stop_agreed_ = false;
  std::string algo_summary_;
  fs::path out_dir_, ckpt_dir_;
  bool resumed_ = false;
  int64_t saved_step_ = -1;  // the step of the newest checkpoint written or resumed from
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<EventWriter> events_;     // logging.tensorboard (rank 0)
  std::unique_ptr<SystemMonitor> monitor_;  // RSS, CPU, NVML figures per window (rank 0)
  std::unique_ptr<ProfileWindow> profile_;  // logging.profile: every rank's trace
  double gpu_peak_ = -1;                    // gpu_peak_flops(); -1: not asked yet
  double step_flops_ = -1;                  // runtime::train_flops; -1: not counted yet
  std::unique_ptr<RankLog> rank_log_;
  FaultInjector faults_{comm_.rank()};
  OverflowInjector overflows_{comm_.rank()};
  SaveFaultInjector save_faults_{comm_.rank()};
  bool inject_overflow_ = false;
  precision::LossScaler scaler_{job_.precision.loss_scale};
  MemoryEstimate estimate_;  // dtrain estimate's figures, for the summary
  std::string init_note_;    // model.init_from's line, printed once the log is open
  Progress progress_{stderr};
  EvalResult last_eval_;
  struct TrainSamples {
    Tokenizer tok;
    std::vector<int32_t> prompt;      // <|endoftext|> and the prompt's tokens
    std::vector<int32_t> candidates;  // what a sample may draw
  };
  std::unique_ptr<TrainSamples> samples_;  // logging.samples.every > 0
};

}  // namespace dtrain::runtime
