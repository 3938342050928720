// Executor behaviour: hook order, flat parameter views, deterministic
// initialisation, and build-time errors that name the node.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "graph/executor.h"
#include "graph/ops.h"

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

void feed(Executor& ex, const Mlp& m) {
  Tensor x = Tensor::empty({4, 6}, DType::f32);
  for (int i = 0; i < 24; ++i) x.data<float>()[i] = static_cast<float>(i % 7) * 0.25f - 0.7f;
  Tensor l = Tensor::empty({4}, DType::i32);
  for (int i = 0; i < 4; ++i) l.data<int32_t>()[i] = i % 3;
  ex.set_input(m.x, x);
  ex.set_input(m.labels, l);
}

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
  std::vector<FlatEntry> entries(2);
  entries[0].name = "a";
  entries[0].spec.shape = Shape{3};
  entries[1].name = "b";
  entries[1].spec.shape = Shape{17};
  FlatStore store(entries);
  CHECK(store.numel() == 20);
  CHECK(store.entries()[1].offset == 16);       // 64-byte aligned: 16 floats
  CHECK(store.buffer_elems(DType::f32) == 48);  // 16 + 32, known before allocation
  CHECK(store.buffer_elems(DType::bf16) == 0);
  store.allocate();
  CHECK(store.flat(DType::f32).numel() == store.buffer_elems(DType::f32));
}
