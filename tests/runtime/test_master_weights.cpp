// runtime::MasterWeights with offload (memory.offload.optimizer): the masters, the
// optimizer state and the gradients' copy live in host memory and the fused step runs
// there, then the parameters go back to the executor. On a GPU that is a download,
// a CPU step and an upload; here, on the CPU, the same code runs with host-to-host
// copies, so an offloaded run must give the bits of the plain one in every precision
// layout (fp32, bf16 with fp32 masters, bf16 stepped in place), and the checkpoint
// view (state() / state_loaded()) must round-trip through the host twins.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "graph/executor.h"
#include "models/registry.h"
#include "optim/optimizer.h"
#include "runtime/master_weights.h"

using namespace dtrain;

namespace {

ModelOptions tiny_gpt() {
  ModelOptions o = preset_options(*find_arch("gpt2-tiny"));
  o.layers = 2;
  o.hidden = 32;
  o.heads = 2;
  o.ffn = 64;
  o.dropout = 0.0;
  o.vocab_size = 60;
  o.seq_len = 16;
  o.max_positions = 16;
  return o;
}

void feed(graph::Executor& ex, const models::ModelGraph& m, int step) {
  Tensor x = Tensor::empty(m.graph.value(m.input).spec.shape, DType::i32);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<int32_t>()[i] = static_cast<int32_t>((7 * i + 3 + 13 * step) % 60);
  ex.set_input(m.input, x);
  Tensor y = Tensor::empty(m.graph.value(m.labels).spec.shape, DType::i32);
  for (int64_t i = 0; i < y.numel(); ++i)
    y.data<int32_t>()[i] = static_cast<int32_t>((11 * i + 5 + step) % 60);
  ex.set_input(m.labels, y);
}

struct Run {
  models::ModelGraph model;
  std::unique_ptr<graph::Executor> ex;
  std::unique_ptr<runtime::MasterWeights> weights;
  std::unique_ptr<optim::Optimizer> opt;
};

Run make_run(DType dtype, runtime::MasterMode mode, bool offload) {
  Run r;
  r.model = models::build_model(tiny_gpt(), 4, graph::DTypePolicy{dtype});
  r.ex = std::make_unique<graph::Executor>(r.model.graph);
  r.ex->initialize(3);
  r.weights = std::make_unique<runtime::MasterWeights>(*r.ex, mode, 3, Device::cpu(), offload);
  OptimizerOptions o;
  o.name = OptimizerName::adamw;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  std::vector<optim::ParamSegment> segs;
  for (const graph::FlatEntry& e : r.weights->layout())
    segs.push_back({e.name, e.offset, e.spec.shape.numel(), optim::DecayMode::decay});
  r.opt = optim::make_optimizer(o, segs, r.weights->grads().numel(), r.weights->optimizer_device());
  return r;
}

void train(Run& r, int steps) {
  for (int s = 0; s < steps; ++s) {
    feed(*r.ex, r.model, s);
    r.ex->forward(graph::Mode::train, static_cast<uint64_t>(s));
    r.ex->backward(r.model.loss, 8.0f);
    r.weights->step(*r.opt, 1e-3, 0.125f);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The executor's parameters (what the model computes with), every dtype buffer.
bool same_executor_params(const Run& a, const Run& b) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = a.ex->params().flat(dt);
    const Tensor y = b.ex->params().flat(dt);
    if (x.defined() != y.defined()) return false;
    if (x.defined() && !same_bits(x, y)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("offloaded optimizer steps give the bits of the plain ones, in every layout") {
  const std::pair<DType, runtime::MasterMode> layouts[] = {
      {DType::f32, runtime::MasterMode::fp32},
      {DType::bf16, runtime::MasterMode::masters},
      {DType::bf16, runtime::MasterMode::in_place}};
  for (const auto& [dtype, mode] : layouts) {
    CAPTURE(dtype_name(dtype));
    CAPTURE(static_cast<int>(mode));
    Run plain = make_run(dtype, mode, false);
    Run off = make_run(dtype, mode, true);
    CHECK(off.weights->offloaded());
    CHECK(off.weights->optimizer_device().is_cpu());
    REQUIRE(same_executor_params(plain, off));  // the same initial bits in the executor
    train(plain, 3);
    train(off, 3);
    CHECK(same_executor_params(plain, off));
    CHECK(
        same_bits(plain.weights->state().flat(DType::f32), off.weights->state().flat(DType::f32)));
    plain.weights->release_state();
    off.weights->release_state();
    for (const auto& [name, t] : plain.opt->state().buffers) {
      CAPTURE(name);
      bool found = false;
      for (const auto& [other, u] : off.opt->state().buffers) {
        if (other != name) continue;
        found = true;
        CHECK(same_bits(t, u));
      }
      CHECK(found);
    }
    // A step must have moved the executor's parameters (the upload happened).
    Run fresh = make_run(dtype, mode, true);
    CHECK_FALSE(same_executor_params(fresh, off));
  }
}

TEST_CASE("offloaded checkpoint view: loading a state publishes it to the executor") {
  for (runtime::MasterMode mode : {runtime::MasterMode::masters, runtime::MasterMode::in_place}) {
    CAPTURE(static_cast<int>(mode));
    Run trained = make_run(DType::bf16, mode, true);
    train(trained, 2);
    Run loaded = make_run(DType::bf16, mode, true);
    REQUIRE_FALSE(same_executor_params(trained, loaded));
    Tensor src = trained.weights->state().flat(DType::f32);
    Tensor dst = loaded.weights->state().flat(DType::f32);
    std::memcpy(dst.raw(), src.raw(), src.nbytes());  // what load_train_state does
    loaded.weights->state_loaded();
    loaded.weights->release_state();
    trained.weights->release_state();
    CHECK(same_executor_params(trained, loaded));
  }
}
