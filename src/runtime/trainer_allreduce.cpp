// The all-reduce algorithm of each gradient bucket (comm.allreduce): the job's, or with
// `auto` the fastest per bucket-size class, timed at start-up or, on a resume that
// matches it, the checkpoint's table, so that the resumed run sums as the run did. In a
// pipeline or tensor grid the data group of rank 0 times and every data group takes its
// table. ZeRO reduces into owners: nothing to choose.
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>

#include "core/checksum.h"
#include "runtime/train_session.h"

namespace dtrain::runtime {

namespace {

// What a grid's data groups agree on for comm.allreduce auto, in one all-gather over
// `world` (collective): every rank's gradient bucket sizes (`bucket_bytes`: this rank's)
// hashed in rank order, and whether every data group can run the hierarchical
// all-reduce (`hierarchical`: this rank's can), so that the one table suits them all.
struct GridTuning {
  uint64_t signature = 0;
  bool hierarchical = true;
};
GridTuning agree_grid_tuning(dist::Communicator& world, const std::vector<int64_t>& bucket_bytes,
                             bool hierarchical) {
  std::array<int64_t, 2> mine = {
      static_cast<int64_t>(fnv1a(fmt::format("{}", fmt::join(bucket_bytes, ",")))),
      hierarchical ? 1 : 0};
  std::vector<int64_t> all(static_cast<size_t>(2 * world.size()));
  const Tensor in = Tensor::wrap(mine.data(), Shape{2}, DType::i64);
  Tensor out = Tensor::wrap(all.data(), Shape{2 * world.size()}, DType::i64);
  world.all_gather(in, out);
  GridTuning t;
  std::vector<int64_t> hashes;
  for (size_t r = 0; r < all.size(); r += 2) {
    hashes.push_back(all[r]);
    t.hierarchical = t.hierarchical && all[r + 1] != 0;
  }
  t.signature = fnv1a(fmt::format("{}", fmt::join(hashes, ",")));
  return t;
}

// The checkpoint's table as this run would have written it (`now`: its world, backend,
// grid, buckets and signature), into `kept`; else why not, for the note.
std::string unfit_table(const std::optional<TrainCounters::AutoAllreduce>& saved,
                        const TrainCounters::AutoAllreduce& now, dist::AutoChoice& kept) {
  if (!saved) return "the checkpoint holds none";
  if (saved->world != now.world)
    return fmt::format("it was timed on {} data ranks, this run has {}", saved->world, now.world);
  if (saved->backend != now.backend)
    return fmt::format("it was timed over {}, this run uses {}", saved->backend, now.backend);
  if (saved->grid != now.grid)
    return "it was timed on another grid (parallel.pipeline, data, tensor)";
  if (saved->buckets != now.buckets || saved->signature != now.signature)
    return "this run's gradient buckets differ (comm.bucket_mb, optimizer.freeze)";
  for (const auto& [bytes, name] : saved->classes) {
    dist::AutoEntry e;
    e.bytes = static_cast<size_t>(bytes);
    if (!from_string(name, e.algo) || e.algo == AllreduceAlgo::hierarchical) {
      kept.entries.clear();  // the nodes may be others now: timed again
      return "it holds hierarchical, and the nodes may be others now";
    }
    kept.entries.push_back(e);
  }
  return kept.entries.empty() ? "its table is empty" : "";
}

}  // namespace

void TrainSession::choose_allreduce(const std::vector<dist::Bucket>& buckets) {
  if (weights_->shard().sharded()) {
    algo_summary_ = "reduce to owners";
    counters_.allreduce_auto.reset();  // no table: a later plain resume times again
    return;
  }
  std::vector<AllreduceAlgo> algos(buckets.size(), job_.comm.allreduce);
  const std::optional<TrainCounters::AutoAllreduce> saved = counters_.allreduce_auto;
  counters_.allreduce_auto.reset();  // what this run chose, below
  std::vector<size_t> bytes;
  for (const dist::Bucket& b : buckets)
    bytes.push_back(static_cast<size_t>(b.end - b.begin) * sizeof(float));
  const bool tuning = grad_comm_->size() > 1 && job_.comm.allreduce == AllreduceAlgo::auto_;
  // This run's table but for its classes: a grid keys it by every rank's buckets, since
  // its groups' buckets differ.
  TrainCounters::AutoAllreduce table;
  table.world = grad_comm_->size();
  table.backend = grad_comm_->backend();
  bool hierarchical = true;  // every data group can run it
  if (grid_) {
    table.grid = {job_.parallel.pipeline, job_.parallel.data, job_.parallel.tensor};
    if (tuning) {
      std::vector<int64_t> mine;
      for (size_t b : bytes) mine.push_back(static_cast<int64_t>(b));
      const GridTuning agreed =
          agree_grid_tuning(comm_, mine, dist::hierarchical_possible(*grad_comm_));
      table.signature = agreed.signature;
      hierarchical = agreed.hierarchical;
    }
  } else {
    for (size_t b : bytes) table.buckets.push_back(static_cast<int64_t>(b));
  }
  dist::AutoChoice kept;  // the checkpoint's, when a resume keeps it
  if (tuning && resumed_) {
    const std::string unfit = unfit_table(saved, table, kept);
    if (!unfit.empty()) {
      note(
          fmt::format("all-reduce auto: timed again, not the checkpoint's table: {}. With 3 or "
                      "more data ranks the resumed run may sum in another order than the run "
                      "did.",
                      unfit));
    }
  }
  if (!kept.entries.empty()) {
    note(dist::format_auto_choice(
        kept,
        "all-reduce auto: the checkpoint's choice, timed when the run started on these "
        "ranks and buckets, so that the resumed run sums as the run did:"));
    for (size_t b = 0; b < buckets.size(); ++b) algos[b] = kept.algo_for(bytes[b]);
    counters_.allreduce_auto = saved;
  } else if (tuning) {
    // Timed in the gradient buffer itself, in its largest bucket (the largest size
    // timed): a bucket's range is written by backward, never zero pages nor another
    // pipeline stage's part, so no buffer is allocated for the timing.
    const bool timer = !grid_ || (coord_.pp == 0 && coord_.tp == 0);  // rank 0's group
    dist::AutoChoice choice;
    if (timer) {
      const auto largest = std::max_element(buckets.begin(), buckets.end(),
                                            [](const dist::Bucket& a, const dist::Bucket& b) {
                                              return a.end - a.begin < b.end - b.begin;
                                            });
      const Tensor scratch =
          largest == buckets.end()
              ? Tensor{}
              : weights_->grads().view(largest->begin, Shape{largest->end - largest->begin});
      choice = dist::tune_allreduce(*grad_comm_, bytes, 3, scratch, hierarchical);
    }
    if (grid_) choice = dist::broadcast_choice(comm_, choice, 0);
    note(timer ? dist::format_auto_choice(choice)
               : dist::format_auto_choice(choice,
                                          "all-reduce auto: the table the data group "
                                          "of rank 0 timed, for every data group:"));
    for (size_t b = 0; b < buckets.size(); ++b) algos[b] = choice.algo_for(bytes[b]);
    for (const dist::AutoEntry& e : choice.entries)
      table.classes.emplace_back(static_cast<int64_t>(e.bytes), std::string(to_string(e.algo)));
    counters_.allreduce_auto = table;  // the checkpoint keeps it for a resume
  } else if (job_.comm.allreduce == AllreduceAlgo::auto_) {
    std::fill(algos.begin(), algos.end(), AllreduceAlgo::native);
  }
  sync_->set_algorithms(algos);
  std::map<std::string, int> counts;
  for (AllreduceAlgo a : algos) ++counts[std::string(to_string(a))];
  for (const auto& [name, n] : counts)
    algo_summary_ += fmt::format("{}{}", algo_summary_.empty() ? "" : "+", name);
}

}  // namespace dtrain::runtime
