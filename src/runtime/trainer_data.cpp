// TrainSession's reading of its feeds (train_session.h): the training batches (a stand-in
// once a batch cannot be read, the step then discarded and the last step saved), the
// evaluation over the test split (agreed batch by batch, its weights optimizer.ema's
// average where there is one), and data.unreadable: skip's warnings.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "kernels/memory.h"
#include "runtime/train_session.h"

namespace dtrain::runtime {

// The training feed's next batch, its wait traced as "data wait".
const FeedBatch& TrainSession::next_batch() {
  if (!data_error_) {
    try {
      const Profiler::Scope wait(profiler(), "data wait", "data");
      const FeedBatch& b = train_->next();
      note_unreadable(b);
      return b;
    } catch (const Error&) {  // a damaged file: the step goes on without it, then ends
      data_error_ = std::current_exception();
    }
  }
  return standin_batch();
}

void TrainSession::note_unreadable(const FeedBatch& b) {
  for (const std::string& why : b.unreadable) {
    ++unreadable_skipped_;
    if (!unreadable_seen_.insert(why).second) continue;
    const std::string line = fmt::format(
        "warning: an unreadable image is left out (data.unreadable: skip; it counts for "
        "nothing in its batch, here and in later epochs): {}",
        why);
    std::fprintf(stderr, "%s: %s\n",
                 comm_.size() > 1 ? fmt::format("dtrain[rank {}]", comm_.rank()).c_str() : "dtrain",
                 line.c_str());
    if (rank_log_) rank_log_->write(line);
  }
}

void TrainSession::prefetch_batch() {
  if (!data_error_) train_->prefetch();
}

// A batch of the model's input shape with no label that counts: its loss is 0 and its
// gradient exactly zero, and no value is out of range (token ids avoid the padding id, so
// no attention row is all masked).
const FeedBatch& TrainSession::standin_batch() {
  if (standin_.input.defined()) return standin_;
  const auto make = [&](graph::ValueId v, double fill) {
    const graph::TensorSpec& spec = model_.graph.value(v).spec;
    Tensor host = Tensor::empty(spec.shape, spec.dtype);
    if (spec.dtype == DType::i32) {
      std::fill_n(host.data<int32_t>(), host.numel(), static_cast<int32_t>(fill));
    } else {
      kernels::fill(host, static_cast<float>(fill));  // images: zeros
    }
    Tensor out = Tensor::empty(spec.shape, spec.dtype, &kernels::device_allocator(job_.device));
    kernels::copy(host, out);
    return out;
  };
  const std::optional<int> pad = padding_token(job_);
  standin_.input = make(model_.input, pad && *pad == 0 ? 1 : 0);
  standin_.labels = make(model_.labels, -100);
  standin_.next = counters_.position;
  standin_.labelled = 0;
  return standin_;
}

// A rank could not read a batch of the step: every rank finished the step's passes (and
// their collectives) and now discards it as a skipped step (buffers back, no update, the
// data position at the step's start), saves the checkpoint of the last step done, unless
// it is on disk already, and ends with the failing rank's error. With compress.method the
// error feedback empties, as after a skipped overflow step.
void TrainSession::fail_training_data(const DataPosition& start) {
  buffer_avg_->discard();
  if (compression_) compression_->adjust(precision::ScaleDecision{.skip = true});
  counters_.position = start;
  const bool save = save_before_failing(false);
  const AgreedStatus failed = agree_status(comm_, [&] {
    if (data_error_) std::rethrow_exception(data_error_);
  });
  const std::string named = failed.error
                                ? "the error below names the file"
                                : fmt::format("rank {}'s error names the file", failed.first);
  if (counters_.step == 0) {
    note(
        fmt::format("step 1 could not read its training data ({}); no step was done: once "
                    "the file is replaced or removed, run the job again",
                    named));
  } else {
    note(fmt::format(
        "step {} could not read its training data ({}) and was discarded; {} {}: once the "
        "file is replaced or removed, --resume latest trains on from step {}",
        counters_.step + 1, named,
        save ? fmt::format("checkpoint saved at step {} in", counters_.step)
             : "the last step's checkpoint is already in",
        ckpt_dir_.string(), counters_.step + 1));
  }
  rethrow_agreed(failed, comm_.rank(), true);  // each rank its own file
}

// With optimizer.ema, of the average (exchanged in and back: every bit restored).
EvalResult TrainSession::evaluate() {
  EvalResult r;
  AgreedStatus failed;
  with_average([&](bool average) {
    r = evaluate_model(failed);
    r.ema = average;
  });
  if (failed) fail_evaluation(failed);  // the weights are the optimizer's again
  return r;
}

// What a run ending on an agreed failure keeps (collective): the last step done saved,
// unless it is on disk already or none was done (`eval_pending`: its evaluation still to
// do), every rank past the save before any exits (and has the launcher end the job), and
// the report so far. Returns whether it saved.
bool TrainSession::save_before_failing(bool eval_pending) {
  const bool save = counters_.step > 0 && saved_step_ != counters_.step;
  if (save) {
    counters_.eval_pending = eval_pending;
    save_checkpoint();
    counters_.eval_pending = false;
  }
  comm_.barrier();
  write_run_report(true);  // quiet: a run that logged no step has none to draw
  return save;
}

// Nothing trained is lost to unreadable test data: every rank is between collectives here,
// so the checkpoint is saved as for a stop signal, saying that this step's evaluation is
// still to do (a resume does it first, as the uninterrupted run would have here).
void TrainSession::fail_evaluation(const AgreedStatus& failed) {
  const bool save = save_before_failing(true);
  const bool data = failed.code == 2;  // bad input: an unreadable file; else an internal fault
  note(
      fmt::format("the evaluation at step {} {} ({}); {} {}: {}--resume latest {}", counters_.step,
                  data ? "could not read the test data" : "failed",
                  failed.error ? "the error below says why"
                               : fmt::format("rank {}'s error says why", failed.first),
                  save ? "checkpoint saved at that step in" : "the step's checkpoint is already in",
                  ckpt_dir_.string(), data ? "once the file is replaced or removed, " : "",
                  counters_.step < total_steps_
                      ? fmt::format("evaluates step {} and trains on", counters_.step)
                      : std::string("runs the final evaluation and writes the summary")));
  rethrow_agreed(failed, comm_.rank(), true);  // each rank its own file
}

// `work` on optimizer.ema's average once it exists (true), else on the weights (false).
// The average goes into the model and back on every rank (collective): a weight tied
// across a pipeline cut follows, the later stage's copy as after a step.
void TrainSession::with_average(const std::function<void(bool average)>& work) {
  const bool average = opt_->ema_ready();
  const auto exchange = [&] {
    Tensor ema = opt_->ema();
    weights_->exchange(ema);
    if (tied_) tied_->publish(ex_->params());
  };
  if (average) exchange();
  work(average);
  if (average) exchange();
}

// Mean loss (plain cross-entropy: Mode::eval, no label smoothing) and top-1 accuracy
// over every predicted label of the test split: images (one label per sample) and
// tokens (every label of a causal-LM window, the masked positions of a masked-LM one)
// alike; -100 labels count for nothing. Each rank evaluates its slice of every batch;
// the sums meet in one all-reduce. Every rank reads each batch before its collectives,
// and the ranks agree that all of them have it (`failed` says which did not).
EvalResult TrainSession::evaluate_model(AgreedStatus& failed) {
  DeviceFeed test(source_->feed(FeedSplit::eval, {}, feed_content()), job_.device);
  double loss_sum = 0, correct = 0, samples = 0;
  for (int64_t k = 0; k < test.batches_per_epoch(); ++k) {
    const FeedBatch* read = nullptr;
    failed = agree_status(comm_, [&] { read = &test.next(); });
    if (failed) return {};
    const FeedBatch& b = *read;
    note_unreadable(b);
    if (pipeline_) {  // every stage forwards its part; the last one counts
      pipeline_->eval_forward(static_cast<uint64_t>(counters_.step), [&] { set_batch(b); });
      if (k + 1 < test.batches_per_epoch()) test.prefetch();
      if (!pipeline_->last()) continue;
    } else {
      set_batch(b);
      ex_->forward(graph::Mode::eval, static_cast<uint64_t>(counters_.step));
    }
    if (zero_params_) zero_params_->end_pass();
    if (k + 1 < test.batches_per_epoch() && !pipeline_) test.prefetch();
    const Tensor logits = host_f32(ex_->value(model_.logits));
    const Tensor targets =
        kernels::to_host(ex_->value(model_.targets));  // labels row for row with logits
    const int64_t rows = targets.numel(), classes = logits.numel() / rows;
    const int32_t* labels = targets.data<int32_t>();
    // Vocabulary-split logits (tensor parallelism): the whole row's argmax, agreed.
    std::vector<int64_t> top;
    if (tensor_split() && !tp_plan_.vocab_values.empty() &&
        tp_plan_.vocab_values[0] == model_.logits) {
      top = split_argmax(logits.reshape({rows, classes}), tp_plan_.vocab_begin, *tp_group_);
    }
    if (coord_.tp != 0) continue;  // tensor ranks share one loss and one count
    int64_t counted = 0;
    for (int64_t i = 0; i < rows; ++i) {
      if (labels[i] < 0) continue;
      const float* row = logits.data<float>() + i * classes;
      const int64_t best =
          top.empty() ? std::max_element(row, row + classes) - row : top[static_cast<size_t>(i)];
      correct += best == labels[i] ? 1 : 0;
      ++counted;
    }
    // The graph's loss is the mean over the counted labels of this batch.
    if (counted > 0) loss_sum += read_scalar(ex_->value(model_.loss)) * counted;
    samples += static_cast<double>(counted);
  }
  const std::array<double, 3> t = sum_over_ranks<3>(comm_, {loss_sum, samples, correct});
  EvalResult r;
  r.samples = static_cast<int64_t>(t[1]);
  r.loss = t[0] / std::max(t[1], 1.0);
  r.accuracy = t[2] / std::max(t[1], 1.0);
  return r;
}

}  // namespace dtrain::runtime
