// Determinism (1 vs 2 OpenMP threads, run vs rerun), the checkpoint round trip of the
// optimizer state, and ZeRO-style shards stepping the same bits as the whole buffer.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "optim/optimizer.h"
#include "reference.h"
#include "util.h"

using namespace dtrain;
using namespace dtrain::optim;
using namespace dtrain::optim::test;

namespace {

constexpr OptimizerName kAll[] = {OptimizerName::sgd, OptimizerName::adamw, OptimizerName::lamb};

struct Run {
  std::vector<float> params;
  std::vector<std::vector<float>> state;
  int64_t step = 0;
};

std::vector<float> copy_of(const Tensor& t) {
  const float* d = t.data<float>();
  return std::vector<float>(d, d + t.numel());
}

Run snapshot(const Optimizer& opt, const std::vector<float>& params) {
  Run r{params, {}, opt.state().step};
  for (const auto& [name, t] : opt.state().buffers) r.state.push_back(copy_of(t));
  return r;
}

// Steps [first, last) of a fixed gradient sequence on `opt`.
void steps(Optimizer& opt, std::vector<float>& p, int first, int last) {
  Tensor pt = as_tensor(p);
  for (int s = first; s < last; ++s) {
    std::vector<float> g = pattern(kTotal, 200 + s);
    opt.step(pt, as_tensor(g), 0.01 * (s + 1));
  }
}

Run run(OptimizerName name, int threads, int n_steps) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto opt = make_optimizer(options_for(name), layout(), kTotal);
  std::vector<float> p = pattern(kTotal, 7);
  steps(*opt, p, 0, n_steps);
  omp_set_num_threads(saved);
  return snapshot(*opt, p);
}

bool same(const Run& a, const Run& b) {
  if (a.step != b.step || a.state.size() != b.state.size()) return false;
  if (!same_bits(a.params.data(), b.params.data(), kTotal)) return false;
  for (size_t i = 0; i < a.state.size(); ++i)
    if (!same_bits(a.state[i].data(), b.state[i].data(), kTotal)) return false;
  return true;
}

}  // namespace

TEST_CASE("every optimizer gives the same bits on 1 and 2 threads, and on a rerun") {
  for (OptimizerName name : kAll) {
    CAPTURE(to_string(name));
    const Run one = run(name, 1, 4);
    CHECK(same(one, run(name, 2, 4)));
    CHECK(same(run(name, 2, 4), run(name, 2, 4)));
    CHECK_FALSE(same(one, run(name, 1, 3)));  // the comparison can fail
  }
}

TEST_CASE("state round trip: resume on a fresh optimizer == uninterrupted run") {
  for (OptimizerName name : kAll) {
    CAPTURE(to_string(name));
    const OptimizerOptions o = options_for(name);
    auto whole = make_optimizer(o, layout(), kTotal);
    std::vector<float> pw = pattern(kTotal, 7);
    steps(*whole, pw, 0, 6);

    auto first = make_optimizer(o, layout(), kTotal);
    std::vector<float> pr = pattern(kTotal, 7);
    steps(*first, pr, 0, 3);
    const Run saved = snapshot(*first, pr);
    first.reset();

    OptimizerState restored{saved.step, {}};
    std::vector<std::vector<float>> storage = saved.state;
    auto names = make_optimizer(o, layout(), kTotal)->state().buffers;
    for (size_t i = 0; i < storage.size(); ++i)
      restored.buffers.emplace_back(names[i].first, as_tensor(storage[i]));
    auto resumed = make_optimizer(o, layout(), kTotal);
    resumed->load_state(restored);
    CHECK(resumed->step_count() == 3);
    steps(*resumed, pr, 3, 6);
    CHECK(same(snapshot(*whole, pw), snapshot(*resumed, pr)));
  }
}

TEST_CASE("state names: momentum for sgd, exp_avg / exp_avg_sq for adamw and lamb") {
  auto sgd = make_optimizer(options_for(OptimizerName::sgd), layout(), kTotal);
  REQUIRE(sgd->state().buffers.size() == 1);
  CHECK(sgd->state().buffers[0].first == "momentum");
  OptimizerOptions plain = options_for(OptimizerName::sgd);
  plain.momentum = 0;
  CHECK(make_optimizer(plain, layout(), kTotal)->state().buffers.empty());
  auto adamw = make_optimizer(options_for(OptimizerName::adamw), layout(), kTotal);
  REQUIRE(adamw->state().buffers.size() == 2);
  CHECK(adamw->state().buffers[0].first == "exp_avg");
  CHECK(adamw->state().buffers[1].first == "exp_avg_sq");
  CHECK(adamw->state().buffers[1].second.numel() == kTotal);
}

TEST_CASE("loading another optimizer's state is a user error naming both") {
  auto sgd = make_optimizer(options_for(OptimizerName::sgd), layout(), kTotal);
  auto adamw = make_optimizer(options_for(OptimizerName::adamw), layout(), kTotal);
  CHECK_THROWS_WITH_AS(adamw->load_state(sgd->state()),
                       doctest::Contains("holds buffers [momentum] at step 0; this adamw "
                                         "optimizer needs [exp_avg, exp_avg_sq]"),
                       Error);
  auto small = make_optimizer(options_for(OptimizerName::sgd), {{"w", 0, 10}}, 10);
  CHECK_THROWS_WITH_AS(small->load_state(sgd->state()),
                       doctest::Contains("momentum is f32[9400] cpu; this model needs f32 [10]"),
                       Error);
}

namespace {

// Steps the shards [0, cut) and [cut, kTotal) with separate optimizers over views.
std::vector<float> sharded(OptimizerName name, int64_t cut, int n_steps) {
  const OptimizerOptions o = options_for(name);
  const SegmentSplit split = segment_split(name);
  auto lo = make_optimizer(o, shard_segments(layout(), 0, cut, split), cut);
  auto hi = make_optimizer(o, shard_segments(layout(), cut, kTotal, split), kTotal - cut);
  std::vector<float> p = pattern(kTotal, 7);
  Tensor pt = as_tensor(p);
  for (int s = 0; s < n_steps; ++s) {
    std::vector<float> g = pattern(kTotal, 200 + s);
    Tensor gt = as_tensor(g);
    Tensor p_lo = pt.view(0, Shape{cut}), p_hi = pt.view(cut, Shape{kTotal - cut});
    lo->step(p_lo, gt.view(0, Shape{cut}), 0.01 * (s + 1));
    hi->step(p_hi, gt.view(cut, Shape{kTotal - cut}), 0.01 * (s + 1));
  }
  return p;
}

}  // namespace

TEST_CASE("shards step the same bits as the whole buffer") {
  const Run adamw = run(OptimizerName::adamw, 1, 4);
  CHECK(same_bits(sharded(OptimizerName::adamw, 5000, 4).data(), adamw.params.data(), kTotal));
  const Run sgd = run(OptimizerName::sgd, 1, 4);
  CHECK(same_bits(sharded(OptimizerName::sgd, 150, 4).data(), sgd.params.data(), kTotal));
  const Run lamb = run(OptimizerName::lamb, 1, 4);
  CHECK(same_bits(sharded(OptimizerName::lamb, 352, 4).data(), lamb.params.data(), kTotal));
}

TEST_CASE("shard_segments rebases and clips, and lamb refuses a cut segment") {
  const auto s = shard_segments(layout(), 200, 400, SegmentSplit::allowed);
  REQUIRE(s.size() == 3);
  CHECK((s[0].offset == 0 && s[0].size == 100 && s[0].name == "w"));
  CHECK((s[1].offset == 120 && s[1].size == 17 && s[1].decay == DecayMode::no_decay));
  CHECK((s[2].offset == 152 && s[2].size == 48));
  CHECK(shard_segments(layout(), 300, 320, SegmentSplit::allowed).empty());
  CHECK(segment_split(OptimizerName::lamb) == SegmentSplit::forbidden);
  CHECK_THROWS_WITH_AS(shard_segments(layout(), 0, 5000, SegmentSplit::forbidden),
                       doctest::Contains("cuts segment big"), InternalError);
}

// optimizer.ema: the average starts as the weights before the first step and follows
// ema = d ema + (1 - d) p after every step (d with or without the warm-up ramp), over
// segment elements only; it is the last state buffer, and a state loaded without it
// (set_ema_ready(false)) starts it again from the weights of the next step.
TEST_CASE("optimizer.ema: the average of the weights, step by step, against an fp64 sum") {
  for (const bool warmup : {false, true}) {
    CAPTURE(warmup);
    OptimizerOptions o = options_for(OptimizerName::adamw);
    o.ema.decay = 0.9;
    o.ema.warmup = warmup;
    auto opt = make_optimizer(o, layout(), kTotal);
    REQUIRE(opt->has_ema());
    REQUIRE(opt->state().buffers.size() == 3);
    CHECK(opt->state().buffers[2].first == "ema");
    CHECK(state_buffer_count(o) == 3);
    CHECK_FALSE(opt->ema_ready());
    std::vector<float> p = pattern(kTotal, 7);
    std::vector<double> expect(p.begin(), p.end());  // the weights before step 1
    Tensor pt = as_tensor(p);
    for (int s = 0; s < 5; ++s) {
      std::vector<float> g = pattern(kTotal, 200 + s);
      opt->step(pt, as_tensor(g), 0.01);
      const double d = warmup ? std::min(0.9, (1.0 + (s + 1)) / (10.0 + (s + 1))) : 0.9;
      CHECK(opt->ema_decay_at(s + 1) == d);
      for (int64_t i = 0; i < kTotal; ++i) expect[i] = d * expect[i] + (1 - d) * p[i];
    }
    CHECK(opt->ema_ready());
    const float* e = opt->ema().data<float>();
    double worst = 0;
    for (const ParamSegment& seg : layout())
      for (int64_t i = seg.offset; i < seg.offset + seg.size; ++i)
        worst = std::max(worst, std::fabs(e[i] - expect[i]) / std::max(1e-3, std::fabs(expect[i])));
    CHECK(worst < 1e-5);
    CHECK(e[310] == 0.0f);  // padding between segments stays 0
    // Loaded without an average: the next step starts it from the weights it is given.
    opt->set_ema_ready(false);
    std::vector<float> g = pattern(kTotal, 300);
    const std::vector<float> before = p;
    opt->step(pt, as_tensor(g), 0.01);
    const double d = opt->ema_decay_at(6);
    for (int64_t i : {int64_t{0}, int64_t{330}, int64_t{5000}}) {
      const double b = before[static_cast<size_t>(i)], w = p[static_cast<size_t>(i)];
      CHECK(e[i] == doctest::Approx(d * b + (1 - d) * w).epsilon(1e-6));
    }
  }
  // Weights that no longer move: the average reaches them and stays on them exactly, at
  // a decay whose two factors would not add up to 1 in f32 (the lerp form).
  OptimizerOptions slow = options_for(OptimizerName::sgd);
  slow.momentum = 0;
  slow.weight_decay = 0;
  slow.ema.decay = 0.99999;
  slow.ema.warmup = false;
  auto still = make_optimizer(slow, layout(), kTotal);
  std::vector<float> w = pattern(kTotal, 9);
  Tensor wt = as_tensor(w);
  std::vector<float> zero(kTotal, 0.0f);
  for (int s = 0; s < 3; ++s) still->step(wt, as_tensor(zero), 0.01);
  for (int64_t i = 0; i < kTotal; i += 97) {
    if (i >= 300 && i < 320) continue;  // padding
    CHECK(still->ema().data<float>()[i] == w[static_cast<size_t>(i)]);
  }
  OptimizerOptions bad = options_for(OptimizerName::sgd);
  bad.ema.decay = 1.0;
  CHECK_THROWS_WITH_AS(make_optimizer(bad, layout(), kTotal),
                       doctest::Contains("optimizer.ema.decay"), Error);
}
