// Kernel-table cases for kernels/optimizer.h: SGD (plain, heavy ball, Nesterov,
// with and without weight decay) and AdamW (first step and a later step, with
// decay) on odd sizes, against the fp64 reference. Steps update in place, so
// the inputs (p, g, state) are copied into the outputs and the step runs there.
// No grad mode: an optimizer step is not differentiated.
#include "kernels/optimizer.h"

#include <cmath>

#include "kernels/memory.h"
#include "pointwise_case_util.h"
#include "ref/optimizer.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;

KernelCase sgd_case(const char* variant, int64_t n, kernels::SgdStep k) {
  KernelCase c;
  c.name = "optimizer/sgd_" + std::string(variant) + "/f32/" + std::to_string(n);
  const bool state = k.momentum != kernels::SgdMomentum::none;
  c.inputs = {{"p_in", Shape{n}}, {"g", Shape{n}}};
  c.outputs = {{"p", Shape{n}}};
  if (state) {
    c.inputs.push_back({"momentum_in", Shape{n}});
    c.outputs.push_back({"momentum", Shape{n}});
  }
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::copy(in[0], out[0]);
    Tensor buf;
    if (state) {
      kernels::copy(in[2], out[1]);
      buf = out[1];
    }
    kernels::sgd_step(k, out[0], in[1], buf);
  };
  const ref::SgdStep rk{k.lr, k.wd, k.mu, static_cast<int>(k.momentum)};
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    out[0] = in[0];
    if (state) out[1] = in[2];
    ref::sgd_step(rk, n, out[0].data(), in[1].data(), state ? out[1].data() : nullptr);
  };
  c.check_tol = {1e-6, 1e-6};
  return c;
}

// AdamW at step t with the src/optim scalars (rounded once to f32).
KernelCase adamw_case(const char* variant, int64_t n, int t, float lr, float wd) {
  const double b1 = 0.9, b2 = 0.999;
  auto f = [](double x) { return static_cast<float>(x); };
  const kernels::AdamStep k{
      f(b1), f(1 - b1), f(b2), f(1 - b2), f(1 - std::pow(b1, t)), f(std::sqrt(1 - std::pow(b2, t))),
      1e-8f, lr,        wd};
  KernelCase c;
  c.name = "optimizer/adamw_" + std::string(variant) + "/f32/" + std::to_string(n);
  ArgSpec v_in{"v_in", Shape{n}};
  v_in.lo = 0.0, v_in.hi = 0.01;  // a second moment is never negative
  c.inputs = {{"p_in", Shape{n}}, {"g", Shape{n}}, {"m_in", Shape{n}, DType::f32}, v_in};
  if (t == 1) {  // the first step starts from zero moments
    c.inputs[2].init = Init::zeros;
    c.inputs[3].init = Init::zeros;
  }
  c.outputs = {{"p", Shape{n}}, {"m", Shape{n}}, {"v", Shape{n}}};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    for (int i = 0; i < 3; ++i) kernels::copy(in[i == 0 ? 0 : i + 1], out[i]);
    kernels::adamw_step(k, out[0], in[1], out[1], out[2]);
  };
  const ref::AdamStep rk{k.b1,  k.one_minus_b1, k.b2, k.one_minus_b2, k.bc1, k.sqrt_bc2,
                         k.eps, k.lr,           k.wd};
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    out[0] = in[0], out[1] = in[2], out[2] = in[3];
    ref::adamw_step(rk, n, out[0].data(), in[1].data(), out[1].data(), out[2].data());
  };
  c.check_tol = {1e-6, 1e-5};
  return c;
}

}  // namespace

std::vector<KernelCase> cases_optimizer() {
  using M = kernels::SgdMomentum;
  std::vector<KernelCase> cases;
  cases.push_back(sgd_case("plain", 1, {0.1f, 0.0f, 0.0f, M::none}));
  cases.push_back(sgd_case("plain_wd", 1003, {0.05f, 1e-2f, 0.0f, M::none}));
  cases.push_back(sgd_case("heavy_ball", 1003, {0.1f, 5e-4f, 0.9f, M::heavy_ball}));
  cases.push_back(sgd_case("nesterov", 517, {0.1f, 5e-4f, 0.9f, M::nesterov}));
  cases.push_back(adamw_case("first_step", 1003, 1, 1e-3f, 0.01f));
  cases.push_back(adamw_case("step_100", 517, 100, 3e-4f, 0.1f));
  cases.push_back(adamw_case("no_decay", 33, 7, 1e-2f, 0.0f));
  return cases;
}

}  // namespace dtrain::test
