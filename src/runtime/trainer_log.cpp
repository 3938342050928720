// TrainSession's reporting side (runtime/train_session.h): the run directory, the
// metrics and TensorBoard lines of each window and evaluation, the console, and the
// summary.
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "runtime/train_session.h"

namespace dtrain::runtime {

void TrainSession::open_run_dir() {
  std::error_code ec;
  fs::create_directories(out_dir_ / "logs", ec);
  if (ec) {
    throw Error(
        fmt::format("run.output_dir: cannot create {}: {}", out_dir_.string(), ec.message()),
        "choose a writable directory");
  }
  rank_log_ = std::make_unique<RankLog>(
      out_dir_ / "logs" / fmt::format("rank-{}.log", comm_.rank()), resumed_);
  rank_log_->write(fmt::format("rank {} of {} ({} communicator), pid {}", comm_.rank(),
                               comm_.size(), comm_.backend(), getpid()));
  if (job_.logging.profile.steps > 0) {  // every rank traces its own steps
    profile_ = std::make_unique<ProfileWindow>(
        job_.logging.profile, model_.graph, job_.device, comm_.rank(),
        out_dir_ / fmt::format("trace-rank-{}.json", comm_.rank()));
  }
  if (!leader()) return;
  std::ofstream(out_dir_ / "job.yaml") << req_.resolved_yaml;
  const int64_t keep_through = resumed_ ? counters_.step : -1;
  if (job_.logging.jsonl)
    metrics_ = std::make_unique<MetricsLog>(out_dir_ / "metrics.jsonl", keep_through);
  if (job_.logging.tensorboard)
    events_ = std::make_unique<EventWriter>(out_dir_ / "tensorboard", keep_through);
  trim_samples(keep_through);
  monitor_ = std::make_unique<SystemMonitor>(job_.device);
}

// A train or eval line to metrics.jsonl and, as scalars "<group>/<key>" (every number
// in it but the step), to TensorBoard.
void TrainSession::publish(const nlohmann::json& line, std::string_view group) {
  if (metrics_) metrics_->write(line);
  if (!events_) return;
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [key, v] : line.items()) {
    if (key == "step" || !v.is_number()) continue;
    values.emplace_back(fmt::format("{}/{}", group, key), v.get<double>());
  }
  events_->scalars(counters_.step, values);
}

void TrainSession::note(const std::string& line) {
  if (leader()) progress_.print(line);
  if (rank_log_) rank_log_->write(line);
}

// The estimate's bytes per kind ("parameters": ..., "activations (train)": ...).
nlohmann::json TrainSession::estimate_by_kind() const {
  nlohmann::json out = nlohmann::json::object();
  for (const MemoryItem& i : estimate_.state) out[i.kind] = i.bytes;
  out["activations (train)"] = estimate_.train.peak;
  out["activations (eval)"] = estimate_.eval.peak;
  return out;
}

// The GPU pool's peak and reserved bytes (absent on the CPU: peak_host_bytes says it).
void TrainSession::add_device_memory(nlohmann::json& line) const {
  if (!job_.device.is_cuda()) return;
  const MemoryStats s = kernels::device_allocator(job_.device).stats();
  line["peak_device_bytes"] = s.peak;
  line["reserved_device_bytes"] = s.reserved;
}

// The peak of the job's GPU in its compute dtype: its datasheet's, as the roofline
// takes it (runtime/roofline.h).
double TrainSession::gpu_peak_flops() {
  if (gpu_peak_ >= 0) return gpu_peak_;
  const DType compute = compute_dtype(job_.precision.dtype);
  const RooflinePeak p =
      roofline_peak(job_.device, compute,
                    job_.precision.tf32 ? kernels::MathMode::tf32 : kernels::MathMode::fp32);
  gpu_peak_ = compute == DType::f32 ? p.matrix_f32_flops : p.matrix_half_flops;
  return gpu_peak_;
}

void TrainSession::log_window(double loss, double seconds, double wait, int64_t steps) {
  const double samples = static_cast<double>(job_.data.global_batch);
  const double lr = optim::lr_at(job_.optimizer.schedule, job_.optimizer.lr,
                                 std::max<int64_t>(opt_->step_count() - 1, 0), total_steps_);
  const dist::SyncStats comm = grad_sync_->take_stats();
  const double bus = grad_comm_->stats().bus_bytes;  // every collective of the window's steps
  const double volume = bus - bus_mark_;
  bus_mark_ = bus;
  // Compression: what this rank put on the wire for its buckets (comm.bytes is the
  // gradient the buckets held, as a dense all-reduce would send it), and the saving.
  const compress::Tally sent = compression_ ? compression_->take_tally() : compress::Tally{};
  if (rank_log_) {
    rank_log_->write(fmt::format(
        "step {} loss {:.6f} step_time {:.4f}s data_wait {:.4f}s "
        "comm {:.4f}s exposed {:.4f}s {} bytes{}",
        counters_.step, loss, seconds, wait, comm.comm_seconds, comm.exposed_seconds, comm.bytes,
        sent.sent > 0 ? fmt::format(" ({} sent compressed)", sent.sent) : ""));
  }
  if (leader()) {
    nlohmann::json line = {{"step", counters_.step},
                           {"epoch", counters_.position.epoch},
                           {"loss", loss},
                           {"lr", lr},
                           {"samples_per_s", samples / seconds},
                           {"step_time_s", seconds},
                           {"window_steps", steps},
                           {"data_wait_s", wait},
                           {"peak_host_bytes", host_allocator().stats().peak}};
    // The model's FLOPs per step on this rank (forward and backward at twice forward,
    // less what optimizer.freeze skips: the roofline's count) over the step time; MFU
    // where the peak is a datasheet's (CUDA): a CPU's must be measured, which `dtrain
    // bench` does, not every run.
    if (step_flops_ < 0)
      step_flops_ = train_flops(model_.graph, ex_->backward_set(), micro_batches_);
    const double flops = step_flops_;
    line["model_gflops_per_s"] = flops / seconds / 1e9;
    if (job_.device.is_cuda()) {
      const double peak = gpu_peak_flops();
      if (peak > 0) line["mfu"] = flops / seconds / peak;
    }
    if (language_model_)
      line["tokens_per_s"] = samples * static_cast<double>(*job_.model.seq_len) / seconds;
    if (comm_.size() > 1) {  // this rank's figures, summed over the window's steps
      line["comm_bytes"] = comm.bytes;
      line["comm_volume_bytes"] = volume;  // dist::CommStats::bus_bytes: the ZeRO paper's units
      line["comm_time_s"] = comm.comm_seconds;
      line["exposed_comm_s"] = comm.exposed_seconds;
      line["allreduce"] = algo_summary_;
      if (sent.sent > 0) {
        line["comm_sent_bytes"] = sent.sent;
        line["compression_ratio"] =
            static_cast<double>(sent.dense) / static_cast<double>(sent.sent);
      }
    }
    if (scaler_.mode() != LossScaleMode::none) {
      line["loss_scale"] = scaler_.scale();
      line["skipped_steps"] = scaler_.state().skipped_steps;
    }
    add_device_memory(line);
    monitor_->add_fields(line);
    publish(line, "train");
  }
  if (job_.logging.console && leader()) {
    const double eta = seconds * static_cast<double>(total_steps_ - counters_.step);
    progress_.update(
        fmt::format("step {}/{}  epoch {}  loss {:.4f}  lr {:.4g}  {:.0f} samples/s  "
                    "ETA {}",
                    counters_.step, total_steps_, counters_.position.epoch, loss, lr,
                    samples / seconds, format_duration(eta)));
  }
}

void TrainSession::log_eval(const EvalResult& r) {
  last_eval_ = r;
  if (leader()) {
    nlohmann::json line = {{"step", counters_.step},
                           {"eval", true},
                           {"test_loss", r.loss},
                           {"test_accuracy", r.accuracy},
                           {"weights", r.ema ? "ema" : "model"}};
    if (language_model_) {  // accuracy over the predicted tokens (the masked ones for BERT)
      line["test_tokens"] = r.samples;
      line["test_perplexity"] = std::exp(r.loss);
    } else {
      line["test_samples"] = r.samples;
    }
    if (counters_.best) {  // train.best
      line["best_step"] = counters_.best->step;
      line["best_metric"] = counters_.best->metric;
    }
    publish(line, "eval");
  }
  std::string text =
      language_model_
          ? fmt::format(
                "eval at step {}{}: test loss {:.4f} (perplexity {:.1f}), token accuracy "
                "{:.2f}% ({} tokens)",
                counters_.step, r.ema ? " (EMA weights)" : "", r.loss, std::exp(r.loss),
                100 * r.accuracy, r.samples)
          : fmt::format("eval at step {}{}: test loss {:.4f}, accuracy {:.2f}% ({} samples)",
                        counters_.step, r.ema ? " (EMA weights)" : "", r.loss, 100 * r.accuracy,
                        r.samples);
  if (counters_.best) {
    text += counters_.best->step == counters_.step
                ? ", the best so far"
                : fmt::format(", the best at step {}", counters_.best->step);
  }
  if (rank_log_) rank_log_->write(text);
  if (job_.logging.console && leader()) progress_.print(text);
}

// report.html from metrics.jsonl (rank 0, at the end and at a stop); a failure to draw
// it fails nothing.
void TrainSession::write_run_report(bool quiet) {
  if (!leader() || !metrics_) return;
  try {
    write_report(out_dir_, out_dir_ / "report.html");
  } catch (const std::exception& e) {
    if (!quiet) note(fmt::format("note: report.html not written: {}", e.what()));
  }
}

// The summary line: the run's figures, the memory estimate beside them, and with
// several ranks every rank's peak (the estimate gives the largest rank's: ZeRO's ranks
// hold different ranges, frozen tensors in some) and in a pipeline every stage's
// figures (collective: one all-gather over the world).
nlohmann::json TrainSession::summary(double secs, int64_t first, double last_loss) {
  nlohmann::json summary = {{"summary", true},
                            {"steps", counters_.step},
                            {"steps_this_run", counters_.step - first},
                            {"train_seconds", secs},
                            {"final_loss", last_loss},
                            {"test_loss", last_eval_.loss},
                            {"test_accuracy", last_eval_.accuracy},
                            {"test_weights", last_eval_.ema ? "ema" : "model"},
                            {"parameters", model_.graph.num_params()},
                            {"world_size", comm_.size()},
                            {"allreduce", algo_summary_},
                            {"peak_host_bytes", host_allocator().stats().peak},
                            {"reserved_host_bytes", host_allocator().stats().reserved},
                            {"memory_estimate",
                             {{"by_kind", estimate_by_kind()},
                              {"peak_bytes", estimate_.peak_bytes},
                              {"state_bytes", estimate_.state_bytes},
                              {"train_activation_bytes", estimate_.train.peak},
                              {"peak_at", estimate_.peak_at}}}};
  if (job_.data.unreadable == UnreadableAction::skip) {  // collective; tensor ranks read alike
    summary["unreadable_skipped"] = sum_over_ranks<1>(
        comm_, {coord_.tp == 0 ? static_cast<double>(unreadable_skipped_) : 0.0})[0];
  }
  if (comm_.size() > 1 && !pipeline_) {  // every rank's peak (collective)
    double mine = static_cast<double>(host_allocator().stats().peak);
    Tensor all = Tensor::empty(Shape{comm_.size()}, DType::f64);
    comm_.all_gather(Tensor::wrap(&mine, Shape{1}, DType::f64), all);
    summary["peak_host_bytes_per_rank"] =
        std::vector<double>(all.data<double>(), all.data<double>() + comm_.size());
  }
  if (pipeline_) {  // every stage's figures (collective): memory, micro-batches held, waits
    std::vector<double> mine = {
        static_cast<double>(pipeline_->stage()), static_cast<double>(host_allocator().stats().peak),
        static_cast<double>(pipeline_->max_in_flight()), pipeline_->exchange_seconds(),
        static_cast<double>(pipeline_->bytes_moved())};
    Tensor in = Tensor::wrap(mine.data(), Shape{5}, DType::f64);
    Tensor all = Tensor::empty(Shape{5 * comm_.size()}, DType::f64);
    comm_.all_gather(in, all);
    const int p = pipeline_->stages(), m = micro_batches_;
    nlohmann::json stages = nlohmann::json::array();
    for (int r = 0; r < comm_.size(); ++r) {
      const double* f = all.data<double>() + 5 * r;
      stages.push_back({{"rank", r},
                        {"stage", static_cast<int>(f[0])},
                        {"peak_host_bytes", f[1]},
                        {"max_micro_batches_in_flight", static_cast<int>(f[2])},
                        {"exchange_seconds", f[3]},
                        {"exchange_share", secs > 0 ? f[3] / secs : 0.0},
                        {"exchange_bytes", f[4]}});
    }
    summary["pipeline"] = {{"stages", p},
                           {"schedule", std::string(to_string(job_.parallel.schedule))},
                           {"micro_batches", m},
                           {"bubble_theory", static_cast<double>(p - 1) / (m + p - 1)},
                           {"per_rank", stages}};
  }
  if (counters_.best) {  // train.best
    const BestEval& b = *counters_.best;
    nlohmann::json best = {{"metric", b.metric},
                           {"weights", b.weights},
                           {"step", b.step},
                           {"test_loss", b.loss},
                           {"test_accuracy", b.accuracy},
                           {"evaluations_since_gain", b.stale_evals}};
    if (job_.train.best.keep_checkpoint) best["record"] = (ckpt_dir_ / kBestRecordName).string();
    summary["best"] = std::move(best);
    summary["stopped_early"] = b.stopped;
  }
  if (scaler_.mode() != LossScaleMode::none) {
    summary["loss_scale"] = scaler_.scale();
    summary["skipped_steps"] = scaler_.state().skipped_steps;
  }
  add_device_memory(summary);
  return summary;
}

}  // namespace dtrain::runtime
