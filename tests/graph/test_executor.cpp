// Executor behaviour: hook order, flat parameter views, deterministic
// initialisation, and build-time errors that name the node.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "graph/executor.h"
#include "graph/ops.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

using namespace dtrain;
using namespace dtrain::graph;

namespace {

struct Mlp {
  Graph g;
  ValueId x, labels, loss;
  Mlp() {
    x = g.input("x", {4, 6}, DType::f32);
    labels = g.input("labels", {4}, DType::i32);
    ValueId h = g.add1("fc1", linear(6, 8, Bias::yes), {x});
    h = g.add1("act", activation(kernels::Activation::gelu_tanh), {h});
    h = g.add1("fc2", linear(8, 3, Bias::no), {h});
    loss = g.add1("loss", softmax_cross_entropy(), {h, labels});
  }
};

// The Mlp tests' batch: x f32 [4, 6], labels i32 [4].
void feed(Executor& ex, ValueId x_id, ValueId labels_id) {
  Tensor x = Tensor::empty({4, 6}, DType::f32);
  for (int i = 0; i < 24; ++i) x.data<float>()[i] = static_cast<float>(i % 7) * 0.25f - 0.7f;
  Tensor l = Tensor::empty({4}, DType::i32);
  for (int i = 0; i < 4; ++i) l.data<int32_t>()[i] = i % 3;
  ex.set_input(x_id, x);
  ex.set_input(labels_id, l);
}

void feed(Executor& ex, const Mlp& m) { feed(ex, m.x, m.labels); }

}  // namespace

TEST_CASE("parameters live in one flat buffer with named views") {
  Mlp m;
  Executor ex(m.g);
  CHECK(m.g.num_params() == 6 * 8 + 8 + 8 * 3);
  CHECK(ex.params().size() == 3);
  CHECK(ex.params().entries()[0].name == "fc1.weight");
  CHECK(ex.params().entries()[1].name == "fc1.bias");
  CHECK(ex.params().entries()[2].name == "fc2.weight");
  const Tensor flat = ex.params().flat(DType::f32);
  const Tensor w2 = ex.params().view("fc2.weight");
  CHECK(w2.shape() == Shape{3, 8});
  CHECK(static_cast<char*>(w2.raw()) - static_cast<char*>(flat.raw()) ==
        static_cast<ptrdiff_t>(ex.params().entries()[2].offset * 4));
  CHECK(ex.params().entries()[2].offset % 16 == 0);  // 64-byte aligned views
  CHECK_THROWS_WITH_AS(ex.params().view("fc3.weight"), doctest::Contains("fc3.weight"), Error);
}

TEST_CASE("initialisation is a pure function of the seed") {
  Mlp m;
  Executor a(m.g), b(m.g), c(m.g);
  a.initialize(3);
  b.initialize(3);
  c.initialize(4);
  const Tensor fa = a.params().flat(DType::f32), fb = b.params().flat(DType::f32);
  CHECK(std::memcmp(fa.raw(), fb.raw(), fa.nbytes()) == 0);
  CHECK(std::memcmp(fa.raw(), c.params().flat(DType::f32).raw(), fa.nbytes()) != 0);
  // Kaiming-uniform bound 1/sqrt(fan_in) for fc1 (fan_in 6).
  const Tensor w = a.params().view("fc1.weight");
  float maxabs = 0;
  for (int i = 0; i < w.numel(); ++i) maxabs = std::max(maxabs, std::abs(w.data<float>()[i]));
  CHECK(maxabs <= 1.0f / std::sqrt(6.0f));
  CHECK(maxabs > 0.5f / std::sqrt(6.0f));
}

TEST_CASE("hooks: pre-op before every op, grad-ready once per parameter as soon as final") {
  Mlp m;
  Executor ex(m.g);
  ex.initialize(1);
  feed(ex, m);
  std::vector<std::pair<int, Phase>> ops;
  std::vector<int> ready;
  std::vector<int> ops_done_at_ready;
  ex.hooks.pre_op = [&](int node, Phase p) { ops.emplace_back(node, p); };
  ex.hooks.grad_ready = [&](int param) {
    ready.push_back(param);
    ops_done_at_ready.push_back(static_cast<int>(ops.size()));
  };
  ex.forward(Mode::train);
  ex.backward(m.loss);
  const std::vector<std::pair<int, Phase>> want_ops = {
      {0, Phase::forward},  {1, Phase::forward},  {2, Phase::forward},  {3, Phase::forward},
      {3, Phase::backward}, {2, Phase::backward}, {1, Phase::backward}, {0, Phase::backward}};
  CHECK(ops == want_ops);
  // fc2.weight is final right after fc2's backward, before act and fc1 run backward.
  CHECK(ready == std::vector<int>{2, 0, 1});
  CHECK(ops_done_at_ready == std::vector<int>{6, 8, 8});
}

TEST_CASE("same seed and inputs give the same loss and gradients, bit for bit") {
  Mlp m;
  Executor a(m.g), b(m.g);
  for (Executor* ex : {&a, &b}) {
    ex->initialize(9);
    feed(*ex, m);
    ex->forward(Mode::train);
    ex->backward(m.loss);
  }
  CHECK(a.value(m.loss).data<float>()[0] == b.value(m.loss).data<float>()[0]);
  const Tensor ga = a.grads().flat(DType::f32), gb = b.grads().flat(DType::f32);
  CHECK(std::memcmp(ga.raw(), gb.raw(), ga.nbytes()) == 0);
}

TEST_CASE("build-time errors name the node and the shapes") {
  Graph g;
  const ValueId x = g.input("x", {2, 5}, DType::f32);
  CHECK_THROWS_WITH_AS(
      g.add1("fc", linear(4, 3, Bias::no), {x}),
      doctest::Contains("graph node \"fc\": op linear: input [2, 5] must end in 4"), Error);
  g.add1("fc", linear(5, 3, Bias::no), {x});
  CHECK_THROWS_WITH_AS(g.add1("fc", linear(5, 3, Bias::no), {x}), doctest::Contains("two nodes"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(3, 4, 3, 0, 1), doctest::Contains("op conv2d: bad geometry"), Error);
  Executor ex(g);
  CHECK_THROWS_WITH_AS(ex.set_input(x, Tensor::empty({2, 4}, DType::f32)),
                       doctest::Contains("graph input \"x\" expects f32[2, 5]"), Error);
}

TEST_CASE("dropout: the identity in eval mode, inverted dropout in train mode") {
  Graph g;
  const ValueId x = g.input("x", {64, 32}, DType::f32);
  const ValueId labels = g.input("labels", {64}, DType::i32);
  const ValueId h = g.add1("fc", linear(32, 32, Bias::no), {x});
  const ValueId d = g.add1("drop", dropout(0.25f), {h});
  const ValueId loss = g.add1("loss", softmax_cross_entropy(), {d, labels});
  Executor ex(g);
  ex.initialize(1);
  ex.keep(h);  // read below, after the step (the executor releases it after its last use)
  ex.keep(d);
  Tensor xt = Tensor::empty({64, 32}, DType::f32), lt = Tensor::empty({64}, DType::i32);
  for (int64_t i = 0; i < xt.numel(); ++i) xt.data<float>()[i] = 0.01f * static_cast<float>(i % 97);
  for (int64_t i = 0; i < 64; ++i) lt.data<int32_t>()[i] = static_cast<int32_t>(i % 32);
  ex.set_input(x, xt);
  ex.set_input(labels, lt);
  ex.forward(Mode::eval);
  const int64_t n = xt.numel();
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(ex.value(d).data<float>()[i] == ex.value(h).data<float>()[i]);
  ex.forward(Mode::train, 7);
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = ex.value(h).data<float>()[i], b = ex.value(d).data<float>()[i];
    if (b == 0.0f && a != 0.0f) {
      ++zeros;
    } else {
      REQUIRE(b == doctest::Approx(a / 0.75f));
    }
  }
  CHECK(zeros > n / 5);  // about a quarter dropped
  CHECK(zeros < n / 3);
  ex.backward(loss);  // runs on the train-mode mask
  double gsum = 0;
  const Tensor gw = ex.grads().view("fc.weight");
  for (int64_t i = 0; i < gw.numel(); ++i) gsum += std::abs(gw.data<float>()[i]);
  CHECK(gsum > 0);
}

TEST_CASE("flat store: buffer_elems is the allocated buffer, alignment padding included") {
  FlatEntry a, b;  // names built, not assigned from literals: GCC 12's -Wrestrict false alarm
  a.name = std::string(1, 'a');
  a.spec.shape = Shape{3};
  b.name = std::string(1, 'b');
  b.spec.shape = Shape{17};
  const std::vector<FlatEntry> entries = {a, b};
  FlatStore store(entries);
  CHECK(store.numel() == 20);
  CHECK(store.entries()[1].offset == 16);       // 64-byte aligned: 16 floats
  CHECK(store.buffer_elems(DType::f32) == 48);  // 16 + 32, known before allocation
  CHECK(store.buffer_elems(DType::bf16) == 0);
  store.allocate();
  CHECK(store.flat(DType::f32).numel() == store.buffer_elems(DType::f32));
}

// Label smoothing is a training target: in Mode::train the loss is the smoothed
// cross-entropy, (1 - e) CE + e mean_j(-log p_j) per row (computed here in double from
// the logits), and its gradient the smoothed one; Mode::eval is plain cross-entropy,
// the loss of the same graph without smoothing.
TEST_CASE("label smoothing: the smoothed loss in training, plain cross-entropy in evaluation") {
  constexpr float kE = 0.1f;
  struct Net {
    Graph g;
    ValueId x, labels, logits, loss;
    explicit Net(float e) {
      x = g.input("x", {4, 6}, DType::f32);
      labels = g.input("labels", {4}, DType::i32);
      logits = g.add1("fc", linear(6, 5, Bias::yes), {x});
      loss = g.add1("loss", softmax_cross_entropy(-100, e), {logits, labels});
    }
  };
  Net smooth(kE), plain(0.0f);
  Executor es(smooth.g), ep(plain.g);
  Tensor xt = Tensor::empty({4, 6}, DType::f32), lt = Tensor::empty({4}, DType::i32);
  for (int i = 0; i < 24; ++i) xt.data<float>()[i] = static_cast<float>(i % 7) * 0.3f - 0.9f;
  for (int i = 0; i < 4; ++i) lt.data<int32_t>()[i] = (2 * i + 1) % 5;
  for (auto [ex, net] : {std::pair{&es, &smooth}, std::pair{&ep, &plain}}) {
    ex->initialize(4);
    ex->keep(net->logits);
    ex->set_input(net->x, xt);
    ex->set_input(net->labels, lt);
  }
  es.forward(Mode::eval);
  ep.forward(Mode::eval);
  const float eval_smooth = es.value(smooth.loss).data<float>()[0];
  CHECK(eval_smooth == ep.value(plain.loss).data<float>()[0]);
  es.forward(Mode::train, 1);
  const float* z = es.value(smooth.logits).data<float>();
  double expect = 0;
  for (int r = 0; r < 4; ++r) {
    double top = z[r * 5];
    for (int j = 1; j < 5; ++j) top = std::max(top, static_cast<double>(z[r * 5 + j]));
    double sum = 0;
    for (int j = 0; j < 5; ++j) sum += std::exp(z[r * 5 + j] - top);
    const double lse = top + std::log(sum);
    double uniform = 0;
    for (int j = 0; j < 5; ++j) uniform += (lse - z[r * 5 + j]) / 5;
    expect += ((1 - kE) * (lse - z[r * 5 + lt.data<int32_t>()[r]]) + kE * uniform) / 4;
  }
  const float train_smooth = es.value(smooth.loss).data<float>()[0];
  CHECK(train_smooth == doctest::Approx(expect).epsilon(1e-6));
  CHECK(train_smooth != eval_smooth);
  // The gradient of the smoothed loss: dlogits = (softmax - target) / rows, so the bias
  // gradient of class j is the mean over rows of p_j - t_j.
  es.backward(smooth.loss);
  const Tensor db = es.grads().view("fc.bias");
  for (int j = 0; j < 5; ++j) {
    double g = 0;
    for (int r = 0; r < 4; ++r) {
      double top = z[r * 5], sum = 0;
      for (int k = 1; k < 5; ++k) top = std::max(top, static_cast<double>(z[r * 5 + k]));
      for (int k = 0; k < 5; ++k) sum += std::exp(z[r * 5 + k] - top);
      const double p = std::exp(z[r * 5 + j] - top) / sum;
      const double t = (j == lt.data<int32_t>()[r] ? 1 - kE : 0.0) + kE / 5;
      g += (p - t) / 4;
    }
    CHECK(db.data<float>()[j] == doctest::Approx(g).epsilon(1e-5));
  }
}

// optimizer.freeze's executor side: a frozen parameter's gradient is zero when
// grad_ready reports it, the others are an unfrozen run's bits, and backward skips what
// only frozen parameters need (fc1 frozen: neither fc1 nor the activation before fc2
// runs backward, and fc2 passes no gradient down).
TEST_CASE("set_frozen: frozen gradients zero, the rest the same bits, their backward skipped") {
  Mlp m;
  Executor plain(m.g), frozen(m.g);
  frozen.set_frozen({1, 1, 0});  // fc1.weight, fc1.bias; fc2.weight trains
  std::vector<std::pair<int, Phase>> ops;
  std::vector<int> ready;
  frozen.hooks.pre_op = [&](int node, Phase p) { ops.emplace_back(node, p); };
  frozen.hooks.grad_ready = [&](int param) {
    ready.push_back(param);
    const Tensor g = frozen.grad_view(param);
    if (param < 2) {
      for (int64_t i = 0; i < g.numel(); ++i) CHECK(g.data<float>()[i] == 0.0f);
    }
  };
  for (Executor* ex : {&plain, &frozen}) {
    ex->initialize(9);
    feed(*ex, m);
    std::memset(ex->grads().flat(DType::f32).raw(), 0x7f, ex->grads().flat(DType::f32).nbytes());
    ex->forward(Mode::train);
    ex->backward(m.loss);
  }
  const std::vector<std::pair<int, Phase>> want_ops = {{0, Phase::forward},  {1, Phase::forward},
                                                       {2, Phase::forward},  {3, Phase::forward},
                                                       {3, Phase::backward}, {2, Phase::backward}};
  CHECK(ops == want_ops);
  CHECK(ready == std::vector<int>{2, 0, 1});
  const Tensor a = plain.grads().view("fc2.weight"), b = frozen.grads().view("fc2.weight");
  CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
  for (const char* name : {"fc1.weight", "fc1.bias"}) {
    CAPTURE(name);
    const Tensor g = frozen.grads().view(name);
    CHECK(
        std::all_of(g.data<float>(), g.data<float>() + g.numel(), [](float x) { return x == 0; }));
    const Tensor p = plain.grads().view(name);
    CHECK_FALSE(
        std::all_of(p.data<float>(), p.data<float>() + p.numel(), [](float x) { return x == 0; }));
  }
  // Freezing fc2 instead: fc1 still needs the gradient through it, so nothing is skipped.
  Executor tail(m.g);
  tail.set_frozen({0, 0, 1});
  ops.clear();
  tail.hooks.pre_op = [&](int node, Phase p) { ops.emplace_back(node, p); };
  tail.initialize(9);
  feed(tail, m);
  tail.forward(Mode::train);
  tail.backward(m.loss);
  CHECK(ops.size() == 8);
  const Tensor w1 = plain.grads().view("fc1.weight"), t1 = tail.grads().view("fc1.weight");
  CHECK(std::memcmp(w1.raw(), t1.raw(), w1.nbytes()) == 0);
  const Tensor w2 = tail.grads().view("fc2.weight");
  CHECK(
      std::all_of(w2.data<float>(), w2.data<float>() + w2.numel(), [](float x) { return x == 0; }));
}

namespace {

// A pass-through op with one parameter that records what backward was handed: whether
// its parameter's and its input's gradient tensors were defined.
struct SpySeen {
  int calls = 0;
  bool grad_param = false, grad_input = false;
};

class Spy final : public Op {
 public:
  Spy(SpySeen* seen, bool skips) : seen_(seen), skips_(skips) {}
  std::string_view kind() const override { return "spy"; }
  bool skips_param_grad(size_t /*k*/) const override { return skips_; }

 protected:
  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    OpInfo info;
    info.outputs = {in[0]};
    info.params = {{"w", {1}, InitKind::zeros}};
    info.keep = Keep::nothing;
    return info;
  }
  void do_forward(OpContext& ctx) const override {
    kernels::scale(1.0f, ctx.inputs[0], ctx.outputs[0]);
  }
  void do_backward(OpContext& ctx) const override {
    ++seen_->calls;
    seen_->grad_param = ctx.grad_params[0].defined();
    seen_->grad_input = ctx.grad_inputs[0].defined();
    if (seen_->grad_param) kernels::fill(ctx.grad_params[0], 0.5f);
    if (seen_->grad_input) kernels::scale(1.0f, ctx.grad_outputs[0], ctx.grad_inputs[0]);
  }

 private:
  SpySeen* seen_;
  bool skips_;
};

// x -> fc1 -> spy -> fc2 -> loss; parameters fc1.weight, fc1.bias, spy.w, fc2.weight.
struct SpyNet {
  Graph g;
  ValueId x, labels, loss;
  SpySeen seen;
  explicit SpyNet(bool skips) {
    x = g.input("x", {4, 6}, DType::f32);
    labels = g.input("labels", {4}, DType::i32);
    ValueId h = g.add1("fc1", linear(6, 8, Bias::yes), {x});
    h = g.add1("spy", std::make_unique<Spy>(&seen, skips), {h});
    h = g.add1("fc2", linear(8, 3, Bias::no), {h});
    loss = g.add1("loss", softmax_cross_entropy(), {h, labels});
  }
  // One training step on the Mlp tests' batch with `frozen` (params() order); the
  // gradients stay readable.
  void step(Executor& ex, std::vector<uint8_t> frozen) {
    ex.set_frozen(std::move(frozen));
    ex.initialize(5);
    feed(ex, x, labels);
    std::memset(ex.grads().flat(DType::f32).raw(), 0x7f, ex.grads().flat(DType::f32).nbytes());
    ex.forward(Mode::train);
    ex.backward(loss);
  }
};

bool all_zero(const Tensor& g) {
  return std::all_of(g.data<float>(), g.data<float>() + g.numel(), [](float v) { return v == 0; });
}

}  // namespace

// optimizer.freeze inside a trained model: a frozen op that still passes its input's
// gradient down gets no gradient tensor for its parameter (Op::skips_param_grad: a frozen
// layer skips its weight-gradient GEMM), and the first trained op after a frozen part
// gets none for its input. The trained gradients are the unfrozen run's bits throughout.
TEST_CASE(
    "set_frozen: no weight gradient for a frozen op behind a trained one, none for an "
    "input nothing trains above") {
  SpyNet plain_net(true);
  Executor plain(plain_net.g);
  plain_net.step(plain, {});
  CHECK(plain_net.seen.grad_param);
  CHECK(plain_net.seen.grad_input);
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias", "fc2.weight"};
  auto same_as_plain = [&](Executor& ex, const std::string& name) {
    const Tensor a = plain.grads().view(name), b = ex.grads().view(name);
    return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  SUBCASE("the spy frozen between trained layers: backward runs, its parameter's is skipped") {
    SpyNet net(true);
    Executor ex(net.g);
    net.step(ex, {0, 0, 1, 0});
    CHECK(net.seen.calls == 1);
    CHECK_FALSE(net.seen.grad_param);
    CHECK(net.seen.grad_input);
    CHECK(all_zero(ex.grads().view("spy.w")));  // zeroed over the 0x7f garbage
    for (const std::string& name : names) CHECK(same_as_plain(ex, name));
  }
  SUBCASE("an op that cannot skip computes it, and it is zeroed before grad_ready") {
    SpyNet net(false);
    Executor ex(net.g);
    net.step(ex, {0, 0, 1, 0});
    CHECK(net.seen.grad_param);
    CHECK(all_zero(ex.grads().view("spy.w")));
    for (const std::string& name : names) CHECK(same_as_plain(ex, name));
  }
  SUBCASE("fc1 frozen: the trained spy gets no gradient for fc1's output") {
    SpyNet net(true);
    Executor ex(net.g);
    net.step(ex, {1, 1, 0, 0});
    CHECK(net.seen.calls == 1);
    CHECK(net.seen.grad_param);
    CHECK_FALSE(net.seen.grad_input);
    CHECK(same_as_plain(ex, "fc2.weight"));
    CHECK(all_zero(ex.grads().view("fc1.weight")));
    CHECK(all_zero(ex.grads().view("fc1.bias")));
  }
  SUBCASE("zero gradients: the spy's is read-only zero pages, written by no op") {
    for (const bool skips : {true, false}) {
      CAPTURE(skips);
      SpyNet net(skips);
      Executor ex(net.g, Device::cpu(), GradBuffer::owned, ParamBuffer::owned, {0, -1},
                  {0, 0, 1, 0});
      CHECK_THROWS_AS(ex.set_frozen({0, 0, 0, 1}), InternalError);  // not the frozen one
      ex.set_frozen({0, 0, 1, 0});
      ex.initialize(5);
      feed(ex, net.x, net.labels);
      for (const std::string& name : names) {  // garbage where backward writes
        const Tensor g = ex.grads().view(name);
        std::memset(g.raw(), 0x7f, g.nbytes());
      }
      ex.forward(Mode::train);
      ex.backward(net.loss);
      CHECK(net.seen.grad_param == !skips);  // computed into a transient, dropped
      CHECK(all_zero(ex.grads().view("spy.w")));
      for (const std::string& name : names) CHECK(same_as_plain(ex, name));
    }
    SpyNet net(true);
    Executor unnamed(net.g, Device::cpu(), GradBuffer::owned, ParamBuffer::owned, {0, -1},
                     {0, 0, 1, 0});
    unnamed.initialize(5);
    feed(unnamed, net.x, net.labels);
    unnamed.forward(Mode::train);
    CHECK_THROWS_AS(unnamed.backward(net.loss), InternalError);  // set_frozen must name it
  }
  SUBCASE("fc1 and the spy frozen: the spy runs no backward at all") {
    SpyNet net(true);
    Executor ex(net.g);
    net.step(ex, {1, 1, 1, 0});
    CHECK(net.seen.calls == 0);
    CHECK(same_as_plain(ex, "fc2.weight"));
  }
}
