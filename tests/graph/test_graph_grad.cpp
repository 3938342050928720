// Gradient checks of composed graphs: the executor's f32 backward against
// central finite differences of an independent fp64 forward built from the
// reference kernels (tests/ref). Two graphs: a conv net
// (conv -> batch-norm -> relu -> max-pool -> linear -> cross-entropy) and one
// pre-LN transformer block (layer-norm, causal attention, GELU MLP, residuals).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>

#include "core/rng.h"
#include "graph/executor.h"
#include "graph/ops.h"
#include "ref/activation.h"
#include "ref/attention.h"
#include "ref/batchnorm.h"
#include "ref/conv.h"
#include "ref/layernorm.h"
#include "ref/pooling.h"
#include "ref/softmax.h"

using namespace dtrain;
using namespace dtrain::graph;
using Values = std::vector<double>;
using Params = std::map<std::string, Values>;

namespace {

Tensor random_tensor(const Shape& s, uint64_t stream, double lo, double hi, DType dt = DType::f32) {
  Tensor t = Tensor::empty(s, dt);
  const Philox rng(99, stream);
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double u = lo + (hi - lo) * rng.uniform(static_cast<uint64_t>(i));
    if (dt == DType::i32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(std::floor(u));
    } else {
      t.data<float>()[i] = static_cast<float>(u);
    }
  }
  return t;
}

Values values_of(const Tensor& t) {
  Values v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[i] = t.dtype() == DType::i32 ? t.data<int32_t>()[i] : t.data<float>()[i];
  }
  return v;
}

// y [rows, out] = x [rows, in] W^T + b
Values linear(const Values& x, const Values& w, const Values& b, int64_t in, int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  Values y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

Values add(const Values& a, const Values& b) {
  Values y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

Values layer_norm(const Values& x, const Params& p, const std::string& name, int64_t c) {
  const int64_t rows = static_cast<int64_t>(x.size()) / c;
  Values y(x.size()), mean(rows), rstd(rows);
  ref::layer_norm(rows, c, 1e-5, x.data(), p.at(name + ".weight").data(),
                  p.at(name + ".bias").data(), y.data(), mean.data(), rstd.data());
  return y;
}

double cross_entropy(const Values& logits, const Values& labels, int64_t classes) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  Values lse(rows);
  double loss = 0;
  ref::cross_entropy({rows, classes, -100, 0.0}, logits.data(), labels.data(), &loss, lse.data());
  return loss;
}

// Compares executor gradients with finite differences of `loss_of` on up to
// `samples` elements of every parameter.
void check_gradients(Executor& ex, const std::function<double(const Params&)>& loss_of,
                     double executor_loss, int samples) {
  Params p;
  for (int i = 0; i < ex.params().size(); ++i) {
    p[ex.params().entries()[i].name] = values_of(ex.params().view(i));
  }
  const double ref_loss = loss_of(p);
  CHECK(executor_loss == doctest::Approx(ref_loss).epsilon(1e-5));
  for (int i = 0; i < ex.params().size(); ++i) {
    const std::string& name = ex.params().entries()[i].name;
    const Values grad = values_of(ex.grads().view(i));
    const int64_t n = static_cast<int64_t>(grad.size());
    const Philox pick(5, static_cast<uint64_t>(i));
    for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
      const int64_t e = n <= samples ? s : static_cast<int64_t>(pick.u32(s) % n);
      Params q = p;
      const double h = 1e-6;
      q[name][e] = p[name][e] + h;
      const double plus = loss_of(q);
      q[name][e] = p[name][e] - h;
      const double minus = loss_of(q);
      const double fd = (plus - minus) / (2 * h);
      INFO(name, "[", e, "]: backward ", grad[e], ", finite difference ", fd);
      CHECK(std::abs(grad[e] - fd) <= 2e-4 + 2e-3 * std::abs(fd));
    }
  }
}

}  // namespace

TEST_CASE("conv -> bn -> relu -> maxpool -> linear -> cross-entropy: gradients match fp64") {
  const int64_t N = 2, C = 3, H = 8, K = 4, classes = 5;
  Graph g;
  const ValueId x = g.input("image", {N, C, H, H}, DType::f32);
  const ValueId labels = g.input("labels", {N}, DType::i32);
  ValueId v = g.add1("conv", conv2d(C, K, 3, 1, 1), {x});
  v = g.add1("bn", batch_norm2d(K), {v});
  v = g.add1("relu", activation(kernels::Activation::relu), {v});
  v = g.add1("pool", pool2d(kernels::PoolKind::max, 2, 2, 0), {v});
  v = g.add1("flatten", flatten(), {v});
  v = g.add1("fc", linear(K * 4 * 4, classes, Bias::yes), {v});
  const ValueId loss = g.add1("loss", softmax_cross_entropy(), {v, labels});

  Executor ex(g);
  ex.initialize(7);
  const Tensor xt = random_tensor({N, C, H, H}, 1, -1, 1);
  const Tensor lt = random_tensor({N}, 2, 0, classes, DType::i32);
  ex.set_input(x, xt);
  ex.set_input(labels, lt);
  ex.forward(Mode::train);
  ex.backward(loss);

  const Values xv = values_of(xt), lv = values_of(lt);
  auto loss_of = [&](const Params& p) {
    const kernels::Conv2dArgs ca{N, C, H, H, K, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    Values y(static_cast<size_t>(N * K * H * H));
    ref::conv2d_forward(ca, xv.data(), p.at("conv.weight").data(), y.data());
    Values bn(y.size()), rm(K, 0.0), rv(K, 1.0), sm(K), si(K);
    ref::batch_norm_forward_train({N, K, H * H, 1e-5f, 0.1f}, y.data(), p.at("bn.weight").data(),
                                  p.at("bn.bias").data(), bn.data(), rm.data(), rv.data(),
                                  sm.data(), si.data());
    for (double& e : bn) e = ref::activation(ref::Activation::relu, e);
    Values pooled(static_cast<size_t>(N * K * 4 * 4)), argmax(pooled.size());
    ref::pool2d_forward(kernels::PoolKind::max, {N, K, H, H, 2, 2, 2, 2, 0, 0}, bn.data(),
                        pooled.data(), argmax.data());
    const Values logits = linear(pooled, p.at("fc.weight"), p.at("fc.bias"), K * 16, classes);
    return cross_entropy(logits, lv, classes);
  };
  check_gradients(ex, loss_of, ex.value(loss).data<float>()[0], 16);
}

TEST_CASE("pre-LN transformer block with causal attention: gradients match fp64") {
  const int64_t B = 2, T = 5, C = 8, heads = 2, D = C / heads, F = 16, V = 7;
  Graph g;
  const ValueId x = g.input("tokens", {B, T, C}, DType::f32);
  const ValueId labels = g.input("labels", {B, T}, DType::i32);
  ValueId h = g.add1("ln1", layer_norm(C), {x});
  h = g.add1("qkv", linear(C, 3 * C, Bias::yes), {h});
  h = g.add1("attn", self_attention(heads, kernels::Causal::yes), {h});
  h = g.add1("proj", linear(C, C, Bias::yes), {h});
  const ValueId r1 = g.add1("res1", add(), {x, h});
  h = g.add1("ln2", layer_norm(C), {r1});
  h = g.add1("fc1", linear(C, F, Bias::yes), {h});
  h = g.add1("gelu", activation(kernels::Activation::gelu_erf), {h});
  h = g.add1("fc2", linear(F, C, Bias::yes), {h});
  const ValueId r2 = g.add1("res2", add(), {r1, h});
  h = g.add1("head", linear(C, V, Bias::yes), {r2});
  const ValueId loss = g.add1("loss", softmax_cross_entropy(), {h, labels});

  Executor ex(g);
  ex.initialize(11);
  const Tensor xt = random_tensor({B, T, C}, 3, -1, 1);
  const Tensor lt = random_tensor({B, T}, 4, 0, V, DType::i32);
  ex.set_input(x, xt);
  ex.set_input(labels, lt);
  ex.forward(Mode::train);
  ex.backward(loss);

  const Values xv = values_of(xt), lv = values_of(lt);
  auto loss_of = [&](const Params& p) {
    Values h1 = layer_norm(xv, p, "ln1", C);
    const Values qkv = linear(h1, p.at("qkv.weight"), p.at("qkv.bias"), C, 3 * C);
    const size_t hs = static_cast<size_t>(B * heads * T * D);
    Values q(hs), k(hs), v(hs), out(hs), lse(static_cast<size_t>(B * heads * T));
    for (int64_t b = 0; b < B; ++b)  // [B, T, 3, H, D] -> three [B, H, T, D]
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hh = 0; hh < heads; ++hh)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t src = (b * T + t) * 3 * C + hh * D + d;
            const int64_t dst = ((b * heads + hh) * T + t) * D + d;
            q[dst] = qkv[src];
            k[dst] = qkv[src + C];
            v[dst] = qkv[src + 2 * C];
          }
    ref::attention_forward({B, heads, T, T, D, 0.0f, kernels::Causal::yes}, q.data(), k.data(),
                           v.data(), nullptr, out.data(), lse.data());
    Values merged(static_cast<size_t>(B * T * C));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < heads; ++hh)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d)
            merged[(b * T + t) * C + hh * D + d] = out[((b * heads + hh) * T + t) * D + d];
    const Values r1v = add(xv, linear(merged, p.at("proj.weight"), p.at("proj.bias"), C, C));
    Values f = linear(layer_norm(r1v, p, "ln2", C), p.at("fc1.weight"), p.at("fc1.bias"), C, F);
    for (double& e : f) e = ref::activation(ref::Activation::gelu_erf, e);
    const Values r2v = add(r1v, linear(f, p.at("fc2.weight"), p.at("fc2.bias"), F, C));
    return cross_entropy(linear(r2v, p.at("head.weight"), p.at("head.bias"), C, V), lv, V);
  };
  check_gradients(ex, loss_of, ex.value(loss).data<float>()[0], 12);
}
