// Gradient buckets: plan_buckets tiles the whole flat buffer from its end; plan_buckets_of
// covers only the given parameters (a pipeline stage's), never spanning a gap between
// them, and GradSync then skips the rest.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "dist/ddp.h"

using namespace dtrain;
using namespace dtrain::dist;

TEST_CASE("buckets over every parameter tile the buffer, over some, only their spans") {
  // Five tensors of 100, 16-element alignment gaps (offsets 0, 112, 224, 336, 448).
  std::vector<GradRange> params;
  for (int64_t i = 0; i < 5; ++i) params.push_back({i * 112, 100});
  const int64_t total = 4 * 112 + 112;
  const std::vector<Bucket> all = plan_buckets(params, total, 200 * sizeof(float));
  REQUIRE(all.size() == 3);
  CHECK(all.front().end == total);
  CHECK(all.back().begin == 0);
  for (size_t b = 1; b < all.size(); ++b) CHECK(all[b].end == all[b - 1].begin);

  // A stage's tensors 2-4 and a tied tensor 0 far from them: two spans, nothing of 1.
  const std::vector<Bucket> some = plan_buckets_of(params, {0, 2, 3, 4}, 1 << 20);
  REQUIRE(some.size() == 2);
  CHECK(some[0].begin == 224);
  CHECK(some[0].end == 548);
  CHECK(some[0].params == std::vector<int>{4, 3, 2});  // launch order: from the end
  CHECK(some[1].begin == 0);
  CHECK(some[1].end == 100);
  CHECK(some[1].params == std::vector<int>{0});
  // A byte limit closes buckets as plan_buckets does.
  const std::vector<Bucket> small = plan_buckets_of(params, {2, 3, 4}, 150 * sizeof(float));
  REQUIRE(small.size() == 2);
  CHECK(small[0].params == std::vector<int>{4, 3});
  CHECK(small[1].params == std::vector<int>{2});

  // GradSync takes parameters in no bucket only when told they are skipped.
  auto comm = make_self_communicator();
  CHECK_THROWS(GradSync(*comm, some, 5, Overlap::on));
  GradSync sync(*comm, some, 5, Overlap::on, Unbucketed::skipped);
  CHECK(sync.buckets().size() == 2);
}

// The step's gradient stage alone (StepGradients, as the trainer drives it): three
// micro-batches on a world of one through GradSync leave their sum in the bucketed
// ranges, added in micro-batch order (((g0) + g1) + g2: the same bits as a loop), and
// a range no bucket holds (another pipeline stage's) as the last backward wrote it.
TEST_CASE("GradSync as a step's gradient stage: micro-batches add up in its buckets only") {
  std::vector<GradRange> params;
  for (int64_t i = 0; i < 5; ++i) params.push_back({i * 112, 100});
  const int64_t total = 5 * 112;
  const std::vector<Bucket> some = plan_buckets_of(params, {0, 2, 3, 4}, 200 * sizeof(float));
  auto comm = make_self_communicator();
  GradSync sync(*comm, some, 5, Overlap::on, Unbucketed::skipped);
  Tensor grads = Tensor::empty(Shape{total}, DType::f32);
  Tensor acc = Tensor::empty(Shape{total}, DType::f32);
  sync.set_accumulation(grads, acc);
  const auto value = [](int m, int64_t x) {
    return 0.1f * static_cast<float>(m + 1) + 1e-3f * static_cast<float>(x);
  };
  StepGradients& stage = sync;
  const int micro_batches = 3;
  for (int m = 0; m < micro_batches; ++m) {
    stage.before_backward(m, micro_batches);
    for (int64_t x = 0; x < total; ++x) grads.data<float>()[x] = value(m, x);  // "backward"
    for (int p = 4; p >= 0; --p) stage.ready(p);
    stage.after_backward(m, micro_batches);
  }
  stage.finish();
  for (int64_t x = 0; x < total; ++x) {
    CAPTURE(x);
    const bool bucketed = std::any_of(some.begin(), some.end(),
                                      [&](const Bucket& b) { return x >= b.begin && x < b.end; });
    const float sum = (value(0, x) + value(1, x)) + value(2, x);
    CHECK(grads.data<float>()[x] == (bucketed ? sum : value(2, x)));
  }
}
