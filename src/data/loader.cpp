// Ring protocol (S slots; S = prefetch + 1 with workers, 1 without): batch k lives
// in slot k % S. A worker may take ticket k once k < released + S, i.e. once the
// consumer has let go of batch k - S; it plans the batch under the lock (the
// sampler walks sequentially), fills it outside, and marks it ready. The consumer
// waits for slot k to be ready with ticket k, so batches come out in order.
#include "data/loader.h"

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace dtrain {

LoaderConfig make_loader_config(const DataOptions& options, Split split, uint64_t seed, int rank,
                                int world, DataPosition start, int channels) {
  LoaderConfig c;
  const bool train = split == Split::train;
  c.sampler.batch = options.micro_batch;
  c.sampler.rank = rank;
  c.sampler.world = world;
  c.sampler.seed = seed;
  c.sampler.shuffle = train && options.shuffle ? Shuffle::on : Shuffle::off;
  c.sampler.tail = train && options.drop_last ? Tail::drop : Tail::pad;
  c.start = start;
  c.workers = options.workers;
  c.prefetch = options.prefetch;
  c.augment.seed = seed;
  if (train) {
    const AugmentOptions defaults = default_augment(options.dataset);
    c.augment.crop_padding = options.augment.crop_padding.value_or(*defaults.crop_padding);
    c.augment.flip = options.augment.flip.value_or(*defaults.flip) ? Flip::on : Flip::off;
    if (defaults.scale) {  // a dataset of images of their own sizes
      c.augment.resized_crop = ResizedCrop{options.augment.scale.value_or(*defaults.scale),
                                           options.augment.ratio.value_or(*defaults.ratio)};
    }
  }
  c.augment.stats = input_normalization(options.dataset, channels);
  c.skip_unreadable = options.unreadable == UnreadableAction::skip;
  return c;
}

ChannelStats input_normalization(DatasetName dataset, int channels) {
  if (const auto shape = dataset_shape(dataset)) channels = shape->channels;
  if (dataset == DatasetName::synthetic) channels = 0;  // uniform [0, 1) pixels, as drawn
  return default_normalization(dataset, channels);
}

namespace {
SamplerConfig with_size(SamplerConfig s, int64_t size) {
  s.dataset_size = size;
  return s;
}
}  // namespace

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderConfig config)
    : dataset_(std::move(dataset)),
      augmenter_(dataset_->geometry(), config.augment),
      read_images_(config.read_images),
      skip_unreadable_(config.skip_unreadable),
      workers_(config.workers),
      sampler_(with_size(config.sampler, dataset_->size()), config.start) {
  DTRAIN_CHECK(workers_ >= 0 && config.prefetch >= 1, "workers {} prefetch {}", workers_,
               config.prefetch);
  DTRAIN_CHECK(!augmenter_.crops_boxes() || dataset_->reads_boxes(),
               "random resized crops of {}, whose images have one size", dataset_->source());
  const ImageGeometry g = dataset_->geometry();
  const int64_t b = config.sampler.batch;
  batches_per_epoch_ = sampler_.batches_per_epoch();
  position_ = sampler_.position();
  slots_.resize(workers_ == 0 ? 1 : static_cast<size_t>(config.prefetch) + 1);
  for (Slot& s : slots_) {
    s.batch.images = Tensor::empty({b, g.channels, g.height, g.width}, DType::f32);
    if (!read_images_) std::memset(s.batch.images.raw(), 0, s.batch.images.nbytes());
    s.batch.labels = Tensor::empty({b}, DType::i32);
    s.indices.resize(static_cast<size_t>(b));
  }
  if (workers_ == 0) scratch_.resize(static_cast<size_t>(g.pixels()));
  threads_.reserve(static_cast<size_t>(workers_));
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Loader::plan(Slot& slot, int64_t ticket) {
  slot.ticket = ticket;
  slot.state = SlotState::filling;
  slot.error = nullptr;
  const BatchInfo info = sampler_.next(slot.indices.data());
  slot.batch.index = ticket;
  slot.batch.epoch = info.epoch;
  slot.batch.valid = info.valid;
  slot.batch.next = info.next;
  slot.batch.unreadable.clear();
}

void Loader::fill(Slot& slot, std::vector<float>& scratch) const {
  const int64_t pixels = dataset_->geometry().pixels();
  float* images = slot.batch.images.data<float>();
  int32_t* labels = slot.batch.labels.data<int32_t>();
  for (size_t j = 0; j < slot.indices.size(); ++j) {
    const int64_t i = slot.indices[j];
    labels[j] = dataset_->label(i);
    if (!read_images_) continue;
    try {
      if (augmenter_.crops_boxes()) {
        const int64_t epoch = slot.batch.epoch;
        dataset_->read_box(
            i, [&](int w, int h) { return augmenter_.crop_box(epoch, i, w, h); }, scratch.data());
      } else {
        dataset_->read(i, scratch.data());
      }
    } catch (const Error& e) {
      if (!skip_unreadable_) throw;
      labels[j] = -100;  // counts for nothing: no loss, no gradient, no accuracy
      std::fill_n(images + static_cast<int64_t>(j) * pixels, pixels, 0.0f);
      slot.batch.unreadable.push_back(e.message());
      continue;
    }
    augmenter_.apply(scratch.data(), images + static_cast<int64_t>(j) * pixels, slot.batch.epoch,
                     i);
  }
}

void Loader::worker_loop() {
  std::vector<float> scratch(static_cast<size_t>(dataset_->geometry().pixels()));
  const auto ring = static_cast<int64_t>(slots_.size());
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || next_ticket_ < released_ + ring; });
    if (stop_) return;
    const int64_t k = next_ticket_++;
    Slot& slot = slots_[static_cast<size_t>(k % ring)];
    try {
      plan(slot, k);
      lk.unlock();
      fill(slot, scratch);
    } catch (...) {
      slot.error = std::current_exception();
    }
    if (!lk.owns_lock()) lk.lock();
    slot.state = SlotState::ready;
    ready_cv_.notify_one();
  }
}

// As with workers, a batch that failed keeps failing: the loader does not skip it.
const Batch& Loader::next_inline() {
  const auto t0 = std::chrono::steady_clock::now();
  Slot& slot = slots_[0];
  if (slot.error) std::rethrow_exception(slot.error);
  try {
    plan(slot, handed_out_);
    fill(slot, scratch_);
  } catch (...) {
    slot.error = std::current_exception();
    throw;
  }
  slot.state = SlotState::ready;
  ++handed_out_;
  position_ = slot.batch.next;
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return slot.batch;
}

const Batch& Loader::next() {
  if (workers_ == 0) return next_inline();
  std::unique_lock<std::mutex> lk(mu_);
  if (holding_) {
    holding_ = false;
    ++released_;
    work_cv_.notify_one();
  }
  const int64_t k = handed_out_;
  Slot& slot = slots_[static_cast<size_t>(k % static_cast<int64_t>(slots_.size()))];
  auto ready = [&] { return slot.ticket == k && slot.state == SlotState::ready; };
  if (!ready()) {
    const auto t0 = std::chrono::steady_clock::now();
    ready_cv_.wait(lk, ready);
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (slot.error) std::rethrow_exception(slot.error);
  ++handed_out_;
  holding_ = true;
  position_ = slot.batch.next;
  return slot.batch;
}

}  // namespace dtrain
