// ZeRO-3's gather schedule (graph/param_units.h) and the executor's external
// parameters: units follow the model's blocks and a tied parameter's first user,
// the schedule releases, acquires and prefetches as documented, and an executor
// whose parameters are handed out only while the schedule holds their unit (with
// activation checkpointing, so recompute asks too) computes the owned executor's
// loss and gradients bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "graph/executor.h"
#include "graph/ops.h"
#include "graph/param_units.h"

using namespace dtrain;
using namespace dtrain::graph;

namespace {

// x -> in (stem) -> [fc, gelu] x 2 blocks -> out (head; its weight tied to in's) -> loss.
struct Blocks {
  Graph g;
  ValueId x, labels, loss;
  Blocks() {
    x = g.input("x", {4, 6}, DType::f32);
    labels = g.input("labels", {4}, DType::i32);
    ValueId h = g.add1("in", linear(6, 6, Bias::yes), {x});
    for (int b = 0; b < 2; ++b) {
      g.begin_block();
      h = g.add1("fc" + std::to_string(b), linear(6, 6, Bias::yes), {h});
      h = g.add1("act" + std::to_string(b), activation(kernels::Activation::gelu_tanh), {h});
      g.end_block();
    }
    h = g.add1("out", linear(6, 6, Bias::yes), {h}, {{0, g.param_index("in.weight")}});
    loss = g.add1("loss", softmax_cross_entropy(), {h, labels});
  }
  void feed(Executor& ex) const {
    Tensor t = Tensor::empty({4, 6}, DType::f32);
    for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i % 5) * 0.3f - 0.6f;
    Tensor l = Tensor::empty({4}, DType::i32);
    for (int i = 0; i < 4; ++i) l.data<int32_t>()[i] = (3 * i + 1) % 6;
    ex.set_input(x, t);
    ex.set_input(labels, l);
  }
};

int node_of(const Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace

TEST_CASE("units follow the blocks, a tied parameter belongs to its first user's") {
  Blocks m;
  // The flat layout's offsets (the graph's own entries have none assigned yet).
  const FlatStore store(m.g.param_layout());
  const ParamUnits u(m.g, store.entries(), m.loss);
  REQUIRE(u.units().size() == 4);  // stem, block 0, block 1, head
  CHECK(u.unit_of(m.g.param_index("in.weight")) == 0);
  CHECK(u.unit_of(m.g.param_index("fc0.bias")) == 1);
  CHECK(u.unit_of(m.g.param_index("fc1.weight")) == 2);
  CHECK(u.unit_of(m.g.param_index("out.bias")) == 3);
  CHECK(u.needs(node_of(m.g, "out")) == std::vector<int>{0, 3});
  CHECK(u.needs(node_of(m.g, "act0")).empty());
  // Each unit spans exactly its parameters' part of the layout.
  const auto& layout = store.entries();
  const FlatEntry& w = layout[static_cast<size_t>(m.g.param_index("fc0.weight"))];
  const FlatEntry& b = layout[static_cast<size_t>(m.g.param_index("fc0.bias"))];
  CHECK(u.units()[1].lo == w.offset);
  CHECK(u.units()[1].hi == b.offset + b.spec.shape.numel());
  CHECK(u.units()[0].wide.empty());  // fp32: nothing gathered apart
}

TEST_CASE("the schedule releases, acquires and prefetches one parameter node ahead") {
  Blocks m;
  const ParamUnits u(m.g, m.g.param_layout(), m.loss);
  GatherSchedule s(u);
  auto at = [&](const char* node, Phase p) { return s.before(node_of(m.g, node), p); };
  GatherActions a = at("in", Phase::forward);
  CHECK(a.release.empty());
  CHECK(a.acquire == std::vector<int>{0});
  CHECK(a.prefetch == std::vector<int>{1});
  a = at("fc0", Phase::forward);
  CHECK(a.release == std::vector<int>{0});
  CHECK(a.acquire == std::vector<int>{1});
  CHECK(a.prefetch == std::vector<int>{2});
  a = at("act0", Phase::forward);  // no parameters: nothing changes, block 0 stays
  CHECK((a.release.empty() && a.acquire.empty() && a.prefetch.empty()));
  CHECK(s.held(1));
  a = at("fc1", Phase::forward);
  CHECK(a.release == std::vector<int>{1});
  CHECK(a.prefetch == std::vector<int>{0, 3});  // the head re-gathers the tied weight
  a = at("out", Phase::forward);
  CHECK(a.release == std::vector<int>{2});
  CHECK(a.prefetch.empty());  // nothing after the head in forward
  // Backward starts where forward ended: the head's units are still held.
  a = at("out", Phase::backward);
  CHECK(a.release.empty());
  CHECK(a.prefetch == std::vector<int>{2});
  // Block 1 is recomputed (checkpointing) before its backward: acquired, no prefetch.
  a = at("fc1", Phase::recompute);
  CHECK(a.release == std::vector<int>{0, 3});
  CHECK(a.acquire == std::vector<int>{2});
  CHECK(a.prefetch.empty());
  a = at("fc1", Phase::backward);
  CHECK(a.release.empty());
  CHECK(a.prefetch == std::vector<int>{1});
  CHECK(s.end_pass() == std::vector<int>{1, 2});
  CHECK(!s.held(1));
}

TEST_CASE("external parameters, handed out only while their unit is held, give the same bits") {
  Blocks m;
  Executor owned(m.g);
  owned.initialize(5);
  Executor ext(m.g, Device::cpu(), GradBuffer::owned, ParamBuffer::external);
  ext.initialize(5);  // buffers only (there are none here); parameters are external
  const ParamUnits u(m.g, m.g.param_layout(), m.loss);
  GatherSchedule s(u);
  int asked = 0, refused = 0;
  ext.set_param_storage([&](int p) {
    ++asked;
    if (!s.held(u.unit_of(p))) ++refused;
    return owned.params().view(p);
  });
  std::vector<std::pair<int, Phase>> seen;
  ext.hooks.pre_op = [&](int node, Phase phase) {
    seen.emplace_back(node, phase);
    s.before(node, phase);
  };
  for (Executor* ex : {&owned, &ext}) {
    ex->set_checkpointing(1);  // each block recomputed in backward: pre_op(recompute) too
    m.feed(*ex);
    ex->forward(Mode::train);
    ex->backward(m.loss);
  }
  s.end_pass();
  CHECK(asked > 0);
  CHECK(refused == 0);
  CHECK(std::count(seen.begin(), seen.end(),
                   std::pair<int, Phase>{node_of(m.g, "fc0"), Phase::recompute}) == 1);
  CHECK(std::memcmp(owned.value(m.loss).raw(), ext.value(m.loss).raw(), 4) == 0);
  const Tensor ga = owned.grads().flat(DType::f32), gb = ext.grads().flat(DType::f32);
  CHECK(std::memcmp(ga.raw(), gb.raw(), ga.nbytes()) == 0);
  CHECK(!ext.params().flat(DType::f32).defined());  // the executor allocated none
}
