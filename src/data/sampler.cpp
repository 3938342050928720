// Philox-driven Fisher-Yates and the (epoch, offset) walk over global batches.
// The permutation is rebuilt once per epoch into a reused vector.
#include "data/sampler.h"

#include <fmt/format.h>

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "data/rng_streams.h"

namespace dtrain {

void epoch_order(int64_t n, uint64_t seed, int64_t epoch, Shuffle shuffle,
                 std::vector<int64_t>& out) {
  out.resize(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  if (shuffle == Shuffle::off) return;
  const Philox rng(seed, rng_stream_id(data_rng::kShuffle, 0, static_cast<uint64_t>(epoch)));
  PhiloxCounter words{};
  for (int64_t t = 0; t + 1 < n; ++t) {
    if (t % 2 == 0) words = rng.block(static_cast<uint64_t>(t / 2));
    const int lane = 2 * static_cast<int>(t % 2);
    const uint64_t u = (uint64_t{words[lane]} << 32) | words[lane + 1];
    const int64_t j = n - 1 - t;
    // Multiply-shift maps u onto [0, j]; the bias is below (j+1) / 2^64.
    const auto k = static_cast<int64_t>(
        (static_cast<unsigned __int128>(u) * static_cast<uint64_t>(j + 1)) >> 64);
    std::swap(out[static_cast<size_t>(j)], out[static_cast<size_t>(k)]);
  }
}

std::string global_batch_phrase(int64_t batch, int world, int64_t micro_steps) {
  return fmt::format(
      "one global batch of {} ({} per rank x {} ranks{})", batch * world * micro_steps, batch,
      world, micro_steps > 1 ? fmt::format(" x {} micro-batches", micro_steps) : std::string());
}

Sampler::Sampler(SamplerConfig config, DataPosition start) : config_(config) {
  const SamplerConfig& c = config_;
  DTRAIN_CHECK(c.batch > 0 && c.world > 0 && c.rank >= 0 && c.rank < c.world && c.micro_steps > 0,
               "batch {} rank {} world {} micro-steps {}", c.batch, c.rank, c.world, c.micro_steps);
  DTRAIN_CHECK(start.epoch >= 0 && start.offset >= 0, "position ({}, {})", start.epoch,
               start.offset);
  if (c.dataset_size <= 0) throw Error("the dataset holds no samples");
  if (c.tail == Tail::drop && c.dataset_size < step_samples())
    throw Error(fmt::format("the dataset holds {} samples{}, fewer than {}: with drop_last every "
                            "batch is dropped",
                            c.dataset_size, c.cut_by.empty() ? "" : " (cut by " + c.cut_by + ")",
                            global_batch_phrase(c.batch, c.world, c.micro_steps)),
                fmt::format("{}lower data.global_batch, or set data.drop_last: false to wrap "
                            "around",
                            c.cut_by.empty() ? "" : "raise " + c.cut_by + ", "));
  pos_ = normalise(start);
}

// Whether the step holding `offset` (a multiple of the global batch) is in the epoch.
bool Sampler::has_batch_at(int64_t offset) const {
  const int64_t n = config_.dataset_size;
  const int64_t step = offset - offset % step_samples();
  return config_.tail == Tail::drop ? step + step_samples() <= n : step < n;
}

DataPosition Sampler::normalise(DataPosition p) const {
  if (!has_batch_at(p.offset)) return {p.epoch + 1, 0};
  return p;
}

int64_t Sampler::batches_per_epoch() const {
  const int64_t n = config_.dataset_size;
  const int64_t g = step_samples();
  return (config_.tail == Tail::drop ? n / g : (n + g - 1) / g) * config_.micro_steps;
}

BatchInfo Sampler::next(int64_t* out) {
  const SamplerConfig& c = config_;
  if (order_epoch_ != pos_.epoch) {
    epoch_order(c.dataset_size, c.seed, pos_.epoch, c.shuffle, order_);
    order_epoch_ = pos_.epoch;
  }
  BatchInfo info;
  info.epoch = pos_.epoch;
  const int64_t first = pos_.offset + c.rank * c.batch;
  for (int64_t j = 0; j < c.batch; ++j) {
    const int64_t p = first + j;
    if (p < c.dataset_size) ++info.valid;
    out[j] = order_[static_cast<size_t>(p % c.dataset_size)];
  }
  pos_ = normalise({pos_.epoch, pos_.offset + global_batch()});
  info.next = pos_;
  return info;
}

}  // namespace dtrain
