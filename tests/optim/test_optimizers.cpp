// SGD, AdamW and LAMB against the fp64 references of reference.h over several steps
// on a padded multi-segment layout, plus hand-computed single steps and the LAMB
// trust-ratio corner cases. Determinism and state round trips are test_state.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "optim/optimizer.h"
#include "reference.h"
#include "util.h"

using namespace dtrain;
using namespace dtrain::optim;
using namespace dtrain::optim::test;

namespace {

using RefStep = void (*)(RefState&, const std::vector<float>&, const std::vector<ParamSegment>&,
                         const OptimizerOptions&, double);

// Runs `steps` steps of both implementations with fresh gradients and a changing lr;
// returns the largest |f32 - fp64| / (1 + |fp64|) over segment elements (about 1e-7
// today), and checks that padding kept its value.
double max_rel_error(const OptimizerOptions& o, RefStep ref, int steps) {
  const auto segs = layout();
  std::vector<float> p = pattern(kTotal, 1);
  RefState r = ref_init(p);
  auto opt = make_optimizer(o, segs, kTotal);
  Tensor pt = as_tensor(p);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g = pattern(kTotal, 100 + s);
    const double lr = 0.05 * (1.0 + 0.1 * s);
    opt->step(pt, as_tensor(g), lr);
    ref(r, g, segs, o, lr);
  }
  double worst = 0;
  for (const auto& seg : segs)
    for (int64_t i = seg.offset; i < seg.offset + seg.size; ++i)
      worst = std::max(worst, std::abs(p[i] - r.p[i]) / (1.0 + std::abs(r.p[i])));
  const std::vector<float> p0 = pattern(kTotal, 1);
  CHECK(p[310] == p0[310]);  // padding between w and b
  CHECK(p[9399] == p0[9399]);
  return worst;
}

}  // namespace

TEST_CASE("sgd matches the fp64 reference: plain, momentum, nesterov") {
  OptimizerOptions o = options_for(OptimizerName::sgd);
  o.momentum = 0.0;
  CHECK(max_rel_error(o, ref_sgd, 5) < 1e-6);
  o.momentum = 0.9;
  CHECK(max_rel_error(o, ref_sgd, 5) < 1e-6);
  o.nesterov = true;
  CHECK(max_rel_error(o, ref_sgd, 5) < 1e-6);
}

TEST_CASE("adamw matches the fp64 reference") {
  OptimizerOptions o = options_for(OptimizerName::adamw);
  CHECK(max_rel_error(o, ref_adamw, 6) < 1e-6);
  o.weight_decay = 0.0;
  CHECK(max_rel_error(o, ref_adamw, 6) < 1e-6);
}

TEST_CASE("lamb matches the fp64 reference") {
  OptimizerOptions o = options_for(OptimizerName::lamb);
  CHECK(max_rel_error(o, ref_lamb, 6) < 1e-6);
}

namespace {

// Two elements: [0] in a decay segment, [1] in a no_decay segment; two steps with
// the given gradients; returns the parameters after each step.
std::vector<std::pair<float, float>> two_steps(const OptimizerOptions& o, std::array<float, 2> g1,
                                               std::array<float, 2> g2) {
  std::vector<ParamSegment> segs = {{"w", 0, 1, DecayMode::decay},
                                    {"b", 1, 1, DecayMode::no_decay}};
  auto opt = make_optimizer(o, segs, 2);
  std::vector<float> p = {1.0f, 1.0f};
  Tensor pt = as_tensor(p);
  std::vector<std::pair<float, float>> out;
  for (auto g : {g1, g2}) {
    std::vector<float> gv(g.begin(), g.end());
    opt->step(pt, as_tensor(gv), 0.1);
    out.emplace_back(p[0], p[1]);
  }
  return out;
}

}  // namespace

TEST_CASE("sgd nesterov by hand: lr 0.1, mu 0.9, wd 0.1") {
  OptimizerOptions o = options_for(OptimizerName::sgd);
  o.nesterov = true;
  const auto p = two_steps(o, {0.5f, 0.5f}, {0.5f, 0.5f});
  // step 1: d = 0.5 + 0.1 * 1 = 0.6, b = d, d' = 0.6 + 0.9 * 0.6 = 1.14, p = 1 - 0.114.
  CHECK(p[0].first == doctest::Approx(0.886).epsilon(1e-6));
  // no_decay: d = 0.5, d' = 0.95, p = 0.905.
  CHECK(p[0].second == doctest::Approx(0.905).epsilon(1e-6));
  // step 2: d = 0.5 + 0.0886, b = 0.9 * 0.6 + 0.5886 = 1.1286, d' = 0.5886 + 0.9 * 1.1286.
  CHECK(p[1].first == doctest::Approx(0.886 - 0.1 * 1.60434).epsilon(1e-6));
  // no_decay: b = 0.9 * 0.5 + 0.5 = 0.95, d' = 0.5 + 0.855 = 1.355, p = 0.905 - 0.1355.
  CHECK(p[1].second == doctest::Approx(0.7695).epsilon(1e-6));
}

TEST_CASE("adamw by hand: lr 0.1, wd 0.1, betas (0.9, 0.999), eps 1e-8") {
  OptimizerOptions o = options_for(OptimizerName::adamw);
  o.betas = {0.9, 0.999};
  const auto p = two_steps(o, {0.5f, -0.5f}, {0.25f, -0.5f});
  // step 1: m^ = g, v^ = g^2, so the step is lr * sign(g); decay first: 1 * (1 - 0.01).
  CHECK(p[0].first == doctest::Approx(0.890000002).epsilon(1e-6));
  CHECK(p[0].second == doctest::Approx(1.1).epsilon(1e-6));
  // step 2 (python, fp64): m = 0.07, v = 3.1225e-4, bc1 = 0.19, bc2 = 1.999e-3.
  CHECK(p[1].first == doctest::Approx(0.7878820404574624).epsilon(1e-6));
  CHECK(p[1].second == doctest::Approx(1.2).epsilon(1e-6));
}

TEST_CASE("lamb trust ratio: ||p|| / ||u||, and 1 for a zero-norm p or u") {
  OptimizerOptions o = options_for(OptimizerName::lamb);
  o.weight_decay = 0.0;
  std::vector<ParamSegment> segs = {{"a", 0, 2, DecayMode::decay},
                                    {"zero_p", 2, 2, DecayMode::decay},
                                    {"zero_g", 4, 2, DecayMode::decay}};
  auto opt = make_optimizer(o, segs, 6);
  std::vector<float> p = {3, 4, 0, 0, 1, 2};
  std::vector<float> g = {1, 1, 1, -1, 0, 0};
  Tensor pt = as_tensor(p);
  opt->step(pt, as_tensor(g), 0.1);
  // a: u = g / (|g| + eps) ~ [1, 1], ||u|| = sqrt 2, ratio = 5 / sqrt 2.
  const double step_a = 0.1 * 5.0 / std::sqrt(2.0);
  CHECK(p[0] == doctest::Approx(3.0 - step_a).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(4.0 - step_a).epsilon(1e-6));
  // zero_p: ||p|| = 0, ratio 1, so p = -lr * sign(g).
  CHECK(p[2] == doctest::Approx(-0.1).epsilon(1e-6));
  CHECK(p[3] == doctest::Approx(0.1).epsilon(1e-6));
  // zero_g with wd 0: u = 0, ratio 1, p unchanged.
  CHECK(p[4] == 1.0f);
  CHECK(p[5] == 2.0f);
}

TEST_CASE("lamb with weight decay: u = wd p alone gives ratio 1 / wd, so p -= lr p") {
  OptimizerOptions o = options_for(OptimizerName::lamb);
  o.weight_decay = 0.5;
  auto opt = make_optimizer(o, {{"w", 0, 2, DecayMode::decay}}, 2);
  std::vector<float> p = {3, 4};
  std::vector<float> g = {0, 0};
  Tensor pt = as_tensor(p);
  opt->step(pt, as_tensor(g), 0.1);
  CHECK(p[0] == doctest::Approx(2.7).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(3.6).epsilon(1e-6));
}

TEST_CASE("make_optimizer rejects options a job file could not have produced") {
  OptimizerOptions o = options_for(OptimizerName::adamw);
  o.betas = {0.9, 1.0};
  CHECK_THROWS_WITH_AS(make_optimizer(o, layout(), kTotal),
                       doctest::Contains("optimizer.betas is 1"), Error);
  o = options_for(OptimizerName::adamw);
  o.nesterov = true;
  CHECK_THROWS_AS(make_optimizer(o, layout(), kTotal), Error);
  CHECK_THROWS_AS(
      make_optimizer(options_for(OptimizerName::sgd),
                     {{"w", 0, 10, DecayMode::decay}, {"v", 5, 10, DecayMode::decay}}, 20),
      InternalError);
}

// optimizer.layer_decay and optimizer.freeze reach the optimizer as each segment's
// lr_scale and frozen flag: a scaled segment steps as an optimizer of that segment alone
// at lr x scale, bit for bit (LAMB's trust ratio included), and a frozen one (its
// gradient zeroed by the executor) keeps its values, zero state and an average equal
// to them.
TEST_CASE("segment lr_scale: lr x scale bit for bit, a frozen segment left untouched") {
  for (const OptimizerName name : {OptimizerName::sgd, OptimizerName::adamw, OptimizerName::lamb}) {
    CAPTURE(to_string(name));
    OptimizerOptions o = options_for(name);
    o.ema.decay = 0.9;
    std::vector<ParamSegment> segs = layout();
    segs[0].lr_scale = 0.25;  // w
    segs[2].frozen = true;    // big
    auto opt = make_optimizer(o, segs, kTotal);
    std::vector<float> p = pattern(kTotal, 1);
    const std::vector<float> p0 = p;
    // The references: w alone at lr / 4, b alone at lr (no_decay, scale 1).
    auto ref_w = make_optimizer(o, {{"w", 0, 300, DecayMode::decay}}, 300);
    auto ref_b = make_optimizer(o, {{"b", 0, 17, DecayMode::no_decay}}, 17);
    std::vector<float> w(p.begin(), p.begin() + 300), b(p.begin() + 320, p.begin() + 337);
    Tensor pt = as_tensor(p), wt = as_tensor(w), bt = as_tensor(b);
    for (int s = 0; s < 3; ++s) {
      std::vector<float> g = pattern(kTotal, 100 + s);
      std::fill(g.begin() + 352, g.begin() + 9352, 0.0f);
      std::vector<float> gw(g.begin(), g.begin() + 300), gb(g.begin() + 320, g.begin() + 337);
      const double lr = 0.05 * (1.0 + 0.1 * s);
      opt->step(pt, as_tensor(g), lr);
      ref_w->step(wt, as_tensor(gw), lr * 0.25);
      ref_b->step(bt, as_tensor(gb), lr);
    }
    CHECK(same_bits(p.data(), w.data(), 300));
    CHECK(same_bits(p.data() + 320, b.data(), 17));
    CHECK_FALSE(same_bits(p.data(), p0.data(), 300));
    CHECK(same_bits(p.data() + 352, p0.data() + 352, 9000));  // frozen
    const OptimizerState st = opt->state();
    for (const auto& [buffer, t] : st.buffers) {
      CAPTURE(buffer);
      const float* v = t.data<float>() + 352;
      if (buffer == kEmaBuffer) {
        CHECK(same_bits(v, p0.data() + 352, 9000));
      } else {
        CHECK(std::all_of(v, v + 9000, [](float x) { return x == 0.0f; }));
      }
    }
  }
}

// A tensor frozen for the first steps and then trained (a resume with a shorter
// optimizer.freeze): set_frozen_steps makes AdamW's and LAMB's bias correction count its
// own steps, so its first update is a fresh optimizer's first step, bit for bit, while
// the other tensor (LAMB: another group of chunks) goes on with the global count.
TEST_CASE("set_frozen_steps: a tensor unfrozen after k steps steps as a fresh one") {
  for (const OptimizerName name : {OptimizerName::adamw, OptimizerName::lamb}) {
    CAPTURE(to_string(name));
    OptimizerOptions o = options_for(name);
    std::vector<ParamSegment> segs = layout();
    segs[0].frozen = true;  // w, for 4 steps
    auto before = make_optimizer(o, segs, kTotal);
    before->set_frozen_steps({});
    std::vector<float> p = pattern(kTotal, 1);
    Tensor pt = as_tensor(p);
    for (int s = 0; s < 4; ++s) {
      std::vector<float> g = pattern(kTotal, 100 + s);
      std::fill(g.begin(), g.begin() + 300, 0.0f);
      before->step(pt, as_tensor(g), 0.05);
    }
    auto after = make_optimizer(o, layout(), kTotal);  // w trains now
    after->load_state(before->state());
    after->set_frozen_steps({{"w", 4}});
    auto fresh = make_optimizer(o, {{"w", 0, 300, DecayMode::decay}}, 300);
    std::vector<float> w(p.begin(), p.begin() + 300);
    std::vector<float> g = pattern(kTotal, 200);
    std::vector<float> gw(g.begin(), g.begin() + 300);
    Tensor wt = as_tensor(w);
    const std::vector<float> start = p;
    after->step(pt, as_tensor(g), 0.05);
    fresh->step(wt, as_tensor(gw), 0.05);
    CHECK(same_bits(p.data(), w.data(), 300));
    // Without the count, the step-5 bias correction of fresh moments: not the same bits.
    auto global = make_optimizer(o, layout(), kTotal);
    global->load_state(before->state());
    std::vector<float> q = start;
    Tensor qt = as_tensor(q);
    global->step(qt, as_tensor(g), 0.05);
    CHECK_FALSE(same_bits(q.data(), w.data(), 300));
    // The rest took the global count: the same bits as without set_frozen_steps.
    CHECK(same_bits(q.data() + 300, p.data() + 300, kTotal - 300));
  }
}

// A frozen segment holds no optimizer state: on the CPU its range of each algorithm
// buffer is zero pages that commit nothing (the average's is whole), a loaded state's
// values there are not taken, and a segment frozen at a load counts every step so far
// as frozen (it restarts as a fresh parameter when unfrozen).
TEST_CASE("a frozen segment holds no state: zero pages, not loaded, its steps restart") {
  const int64_t big = 1 << 20;  // 4 MiB of f32: frozen
  const std::vector<ParamSegment> segs = {{"head", 0, 1000, DecayMode::decay},
                                          {"body", 1024, big, DecayMode::decay}};
  const int64_t total = 1024 + big;
  std::vector<ParamSegment> frozen = segs;
  frozen[1].frozen = true;
  CHECK(stateful_ranges(frozen) == std::vector<std::pair<int64_t, int64_t>>{{0, 1000}});
  CHECK(drops_frozen_state(frozen, Device::cpu()));
  CHECK_FALSE(drops_frozen_state(segs, Device::cpu()));
  for (const OptimizerName name : {OptimizerName::sgd, OptimizerName::adamw, OptimizerName::lamb}) {
    CAPTURE(to_string(name));
    OptimizerOptions o = options_for(name);
    o.ema.decay = 0.9;
    const size_t before = host_allocator().stats().current;
    auto whole = make_optimizer(o, segs, total);
    const size_t whole_bytes = host_allocator().stats().current - before;
    auto opt = make_optimizer(o, frozen, total);
    const size_t bytes = host_allocator().stats().current - before - whole_bytes;
    const int algorithm = state_buffer_count(o) - 1;
    // The average whole, each algorithm buffer one page (the head's 4000 bytes), and
    // LAMB's chunk tables (a few small blocks).
    const size_t expected = CachingAllocator::size_class(static_cast<size_t>(total) * 4) +
                            static_cast<size_t>(algorithm) * held_pages_bytes({{0, 4000}});
    CHECK(bytes < whole_bytes);
    CHECK(bytes >= expected);
    CHECK(bytes - expected <= (name == OptimizerName::lamb ? 4096u : 0u));
    // Train both a step (the body's gradient is zero, as the executor leaves it), then
    // load the trained state into the frozen optimizer: the head's exactly, no body.
    std::vector<float> p = pattern(total, 1), q = p;
    std::vector<float> g = pattern(total, 7);
    Tensor pt = as_tensor(p);
    whole->step(pt, as_tensor(g), 0.01);
    std::fill(g.begin() + 1024, g.end(), 0.0f);
    opt->step(pt, as_tensor(g), 0.01);  // reads and writes the head's state only
    opt->load_state(whole->state());
    const OptimizerState a = whole->state(), b = opt->state();
    for (size_t i = 0; i < a.buffers.size(); ++i) {
      CAPTURE(a.buffers[i].first);
      const float* x = a.buffers[i].second.data<float>();
      const float* y = b.buffers[i].second.data<float>();
      CHECK(same_bits(x, y, 1000));
      if (a.buffers[i].first == kEmaBuffer) {
        CHECK(same_bits(x + 1024, y + 1024, big));
      } else {
        CHECK(std::any_of(x + 1024, x + total, [](float v) { return v != 0.0f; }));
        CHECK(std::all_of(y + 1024, y + total, [](float v) { return v == 0.0f; }));
      }
    }
    // The load's step count, all of it frozen for the body.
    CHECK(opt->step_count() == 1);
    auto fresh = make_optimizer(o, {{"body", 0, big, DecayMode::decay}}, big);
    auto unfrozen = make_optimizer(o, segs, total);
    unfrozen->load_state(opt->state());
    unfrozen->set_frozen_steps({{"body", 1}});
    std::vector<float> body(q.begin() + 1024, q.end()), gb(g.size() - 1024, 0.0f);
    std::vector<float> g2 = pattern(total, 9);
    std::copy(g2.begin() + 1024, g2.end(), gb.begin());
    Tensor qt = as_tensor(q), bt = as_tensor(body);
    unfrozen->step(qt, as_tensor(g2), 0.01);
    fresh->step(bt, as_tensor(gb), 0.01);
    CHECK(same_bits(q.data() + 1024, body.data(), big));
  }
}
