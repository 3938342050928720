// Loader: the batch stream is bit-identical for workers 0, 1 and 3, reuses its ring
// buffers, resumes from a batch's position, and hands a worker's exception to the
// consumer at the failing batch. No timing is asserted.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <vector>

#include "core/error.h"
#include "data/loader.h"

using namespace dtrain;

namespace {

const ImageGeometry kG{3, 8, 8, 10};

LoaderConfig config(int workers, int prefetch = 2) {
  LoaderConfig c;
  c.sampler.batch = 8;
  c.sampler.world = 2;
  c.sampler.rank = 1;
  c.sampler.seed = 21;
  c.sampler.tail = Tail::pad;
  c.augment = {2, Flip::on, default_normalization(DatasetName::synthetic, 3), 21, {}};
  c.workers = workers;
  c.prefetch = prefetch;
  return c;
}

struct Record {
  std::vector<float> images;
  std::vector<int32_t> labels;
  int64_t epoch, valid;
  DataPosition next;
  bool operator==(const Record&) const = default;
};

Record record(const Batch& b) {
  const float* im = b.images.data<float>();
  const int32_t* lb = b.labels.data<int32_t>();
  return {{im, im + b.images.numel()}, {lb, lb + b.labels.numel()}, b.epoch, b.valid, b.next};
}

std::vector<Record> drain(const std::shared_ptr<const Dataset>& d, const LoaderConfig& c, int n) {
  Loader loader(d, c);
  std::vector<Record> out;
  for (int k = 0; k < n; ++k) {
    const Batch& b = loader.next();
    CHECK(b.index == k);
    out.push_back(record(b));
  }
  return out;
}

// Throws a user error when sample `bad` is read.
class Failing final : public Dataset {
 public:
  Failing(int64_t bad) : inner_(kG, 100, 1, Split::train), bad_(bad) {}
  int64_t size() const override { return inner_.size(); }
  ImageGeometry geometry() const override { return kG; }
  void read(int64_t i, float* out) const override {
    if (i == bad_) throw Error("sample 37 is unreadable");
    inner_.read(i, out);
  }
  int32_t label(int64_t i) const override { return inner_.label(i); }
  std::string source() const override { return "failing"; }

 private:
  SyntheticDataset inner_;
  int64_t bad_;
};

}  // namespace

TEST_CASE("the batch stream is identical for workers 0, 1 and 3") {
  const auto d = std::make_shared<SyntheticDataset>(kG, 90, 5, Split::train);
  const auto ref = drain(d, config(0), 20);  // 6 batches per epoch: crosses 3 epochs
  CHECK(ref[5].next == DataPosition{1, 0});
  CHECK(ref[5].valid == 2);  // offset 80, rank 1: positions 88, 89 real, the rest wrap
  CHECK(ref[0].images != ref[6].images);
  CHECK(drain(d, config(1), 20) == ref);
  CHECK(drain(d, config(3), 20) == ref);
  CHECK(drain(d, config(3, 5), 20) == ref);
}

TEST_CASE("batches land in a fixed ring of buffers") {
  const auto d = std::make_shared<SyntheticDataset>(kG, 90, 5, Split::train);
  Loader loader(d, config(2, 3));
  std::set<const void*> buffers;
  for (int k = 0; k < 30; ++k) buffers.insert(loader.next().images.raw());
  CHECK(buffers.size() == 4);  // prefetch + the one the consumer holds
  CHECK(loader.wait_seconds() >= 0.0);
}

TEST_CASE("a loader started at a batch's position continues the stream exactly") {
  const auto d = std::make_shared<SyntheticDataset>(kG, 90, 5, Split::train);
  const auto ref = drain(d, config(0), 16);
  for (const int at : {3, 5, 11}) {
    LoaderConfig c = config(2);
    c.start = ref[static_cast<size_t>(at)].next;
    const auto rest = drain(d, c, 16 - at - 1);
    CHECK(rest == std::vector<Record>(ref.begin() + at + 1, ref.end()));
  }
  Loader fresh(d, config(0));
  CHECK(fresh.position() == DataPosition{});
  fresh.next();
  CHECK(fresh.position() == ref[0].next);
  CHECK(fresh.wait_seconds() > 0.0);  // workers = 0: loading is waiting
}

TEST_CASE("a worker's exception reaches the consumer at the failing batch") {
  for (const int workers : {0, 1, 3}) {
    CAPTURE(workers);
    LoaderConfig c = config(workers);
    c.sampler.shuffle = Shuffle::off;
    c.sampler.world = 1;
    c.sampler.rank = 0;
    Loader loader(std::make_shared<Failing>(37), c);  // sample 37 sits in batch 4
    for (int k = 0; k < 4; ++k) CHECK(loader.next().index == k);
    CHECK_THROWS_WITH_AS(loader.next(), "sample 37 is unreadable", Error);
    CHECK_THROWS_AS(loader.next(), Error);  // the failed batch is not skipped
  }
}

TEST_CASE("job options: the train split shuffles and augments, the test split does neither") {
  DataOptions o;
  o.dataset = DatasetName::cifar10;
  o.micro_batch = 16;
  o.workers = 3;
  const LoaderConfig train = make_loader_config(o, Split::train, 9, 1, 4);
  CHECK(train.sampler.shuffle == Shuffle::on);
  CHECK(train.sampler.tail == Tail::drop);
  CHECK(train.augment.crop_padding == 4);
  CHECK(train.augment.flip == Flip::on);
  CHECK(train.sampler.rank == 1);
  CHECK(train.workers == 3);
  const LoaderConfig test = make_loader_config(o, Split::test, 9);
  CHECK(test.sampler.shuffle == Shuffle::off);
  CHECK(test.sampler.tail == Tail::pad);
  CHECK(test.augment.crop_padding == 0);
  CHECK(test.augment.flip == Flip::off);
  CHECK(test.augment.stats.mean.size() == 3);
  o.augment.flip = false;
  CHECK(make_loader_config(o, Split::train, 9).augment.flip == Flip::off);
}
