// TrainSession's best evaluation (train.best): which evaluation is the best so far,
// its checkpoint kept out of the rotation and named by <checkpoint dir>/best.json, and
// early stopping once `patience` evaluations in a row have not gained more than
// min_delta. Every rank takes the same decisions: an evaluation's figures are summed
// over the world (evaluate()), so the saves they call for stay collective.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "data/atomic_file.h"
#include "runtime/train_session.h"

namespace dtrain::runtime {

namespace {

double value_of(BestMetric m, double loss, double accuracy) {
  return m == BestMetric::loss ? loss : accuracy;
}

// Whether `v` is better than `than` by more than `delta` (a NaN never is).
bool gains(BestMetric m, double v, double than, double delta) {
  return m == BestMetric::loss ? v < than - delta : v > than + delta;
}

}  // namespace

bool TrainSession::track_best(const EvalResult& r, bool counts_for_patience) {
  const BestOptions& o = job_.train.best;
  if (o.metric == BestMetric::none) return false;
  const double v = value_of(o.metric, r.loss, r.accuracy);
  std::optional<BestEval>& b = counters_.best;
  if (!b) {
    if (!std::isfinite(v)) return false;  // nothing to compare with yet
    b = BestEval{std::string(to_string(o.metric)), counters_.step, r.loss, r.accuracy, v, 0};
    b->weights = r.ema ? "ema" : "model";
    return o.keep_checkpoint;
  }
  const bool better = gains(o.metric, v, value_of(o.metric, b->loss, b->accuracy), 0);
  if (counts_for_patience && gains(o.metric, v, b->reference, o.min_delta)) {
    b->reference = v;
    b->stale_evals = 0;
  } else if (counts_for_patience) {
    ++b->stale_evals;
  }
  if (!better) return false;
  b->step = counters_.step;
  b->loss = r.loss;
  b->accuracy = r.accuracy;
  return o.keep_checkpoint;
}

// Only for the job's own metric: a best tracked by another one is dropped at start.
bool TrainSession::patience_spent() const {
  const BestOptions& o = job_.train.best;
  return o.patience > 0 && counters_.best && counters_.best->metric == to_string(o.metric) &&
         counters_.best->stale_evals >= o.patience;
}

std::vector<int64_t> TrainSession::kept_best_steps() const {
  std::vector<int64_t> steps;
  if (job_.train.best.metric == BestMetric::none || !job_.train.best.keep_checkpoint) return steps;
  if (counters_.best) steps.push_back(counters_.best->step);
  // The one best.json still names: until it is rewritten (record_best), a crash must
  // leave it a checkpoint to name.
  try {
    if (const std::optional<int64_t> on_disk = best_record_step(ckpt_dir_))
      steps.push_back(*on_disk);
  } catch (const Error&) {  // unreadable: record_best rewrites it
  }
  return steps;
}

void TrainSession::prune() {
  if (leader()) prune_checkpoints(ckpt_dir_, job_.train.checkpoint.keep, kept_best_steps());
}

// best.json as the counters say, then the rotation without the previous best. Written
// after the checkpoint it names is complete; the leader's.
void TrainSession::record_best(std::string_view gone) {
  if (!leader()) return;
  const fs::path file = ckpt_dir_ / kBestRecordName;
  const bool keep = job_.train.best.metric != BestMetric::none && job_.train.best.keep_checkpoint;
  if (!keep || !counters_.best) {  // nothing (any longer) to name: a stale record goes
    std::error_code ec;
    if (fs::exists(file, ec)) {
      fs::remove(file, ec);
      note(fmt::format("note: {} removed: {}", file.string(),
                       !gone.empty() ? gone
                       : keep        ? "it named a checkpoint of a run this one does not continue"
                                     : "train.best keeps no checkpoint in this job"));
    }
    return;
  }
  const BestEval& b = *counters_.best;
  nlohmann::json record = {
      {"metric", b.metric},  {"weights", b.weights},        {"step", b.step},
      {"test_loss", b.loss}, {"test_accuracy", b.accuracy}, {"checkpoint", nullptr}};
  for (const fs::path& p : list_checkpoints(ckpt_dir_))
    if (step_of_name(p) == b.step) record["checkpoint"] = p.filename().string();
  if (record["checkpoint"].is_null()) {
    note(
        fmt::format("note: the best evaluation's checkpoint (step {}) is not in {}: {} names "
                    "no file",
                    b.step, ckpt_dir_.string(), file.string()));
  }
  const std::string text = record.dump(2) + "\n";
  write_file_atomic(file.string(), {text});
  prune_checkpoints(ckpt_dir_, job_.train.checkpoint.keep, {b.step});
}

// At start-up, once a resume has set aside the checkpoints it abandons: the record
// follows the checkpoint the run continues from (or goes, for a fresh run whose
// directory held only a stale one). A checkpoint tracked by another metric starts the
// comparison anew.
void TrainSession::start_best() {
  const BestOptions& o = job_.train.best;
  std::string gone;
  if (counters_.best && counters_.best->metric != to_string(o.metric)) {
    if (o.metric != BestMetric::none) {
      note(
          fmt::format("note: the checkpoint tracked its best evaluation by {}; this job's "
                      "train.best.metric is {}: the comparison starts anew",
                      counters_.best->metric, to_string(o.metric)));
      gone = fmt::format("its best by {} is no longer kept out of the rotation",
                         counters_.best->metric);
    }
    counters_.best.reset();
  }
  // Evaluations of optimizer.ema's average and of the weights are not compared either: a
  // resume that switches the average on or off starts anew too.
  const std::string weights = opt_->has_ema() ? "ema" : "model";
  if (counters_.best && counters_.best->weights != weights) {
    note(
        fmt::format("note: the checkpoint's best evaluation was of {}; this job's are of {}: "
                    "the comparison starts anew",
                    counters_.best->weights == "ema" ? "the average of the weights (optimizer.ema)"
                                                     : "the weights",
                    weights == "ema" ? "their average" : "the weights"));
    gone = "its best was of other weights, no longer kept out of the rotation";
    counters_.best.reset();
  }
  // A run that stopped early and is resumed with more patience trains on.
  if (counters_.best) counters_.best->stopped = false;
  record_best(gone);
}

}  // namespace dtrain::runtime
