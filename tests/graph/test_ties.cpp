// Weight tying and the transformer input ops: a tied parameter is stored and
// counted once, its gradient is the sum of its users' and grad_ready fires
// once, after the last contribution; patchify + linear equals a stride-P conv;
// embedding ids are checked; a key-padding mask hides the padded keys.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "graph/executor.h"
#include "graph/ops.h"
#include "kernels/elementwise.h"

using namespace dtrain;
using namespace dtrain::graph;

namespace {

Tensor ramp(const Shape& s, float step, float offset) {
  Tensor t = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < s.numel(); ++i) t.data<float>()[i] = std::sin(step * i) + offset;
  return t;
}

Tensor labels_of(int64_t n, int classes) {
  Tensor t = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>((5 * i + 2) % classes);
  return t;
}

std::vector<float> copy_of(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// x [4, 6] -> fc1 (6 -> 6) -> gelu -> fc2 (6 -> 6) -> cross-entropy; fc2's weight
// is fc1's when `tied`.
struct TwoLinear {
  Graph g;
  ValueId x, labels, loss;
  explicit TwoLinear(bool tied) {
    x = g.input("x", {4, 6}, DType::f32);
    labels = g.input("labels", {4}, DType::i32);
    ValueId h = g.add1("fc1", linear(6, 6, Bias::no), {x});
    h = g.add1("act", activation(kernels::Activation::gelu_tanh), {h});
    std::vector<Tie> ties;
    if (tied) ties.push_back({0, g.param_index("fc1.weight")});
    h = g.add1("fc2", linear(6, 6, Bias::yes), {h}, ties);
    loss = g.add1("loss", softmax_cross_entropy(), {h, labels});
  }
  void run(Executor& ex) const {
    ex.set_input(x, ramp({4, 6}, 0.7f, 0.1f));
    ex.set_input(labels, labels_of(4, 6));
    ex.forward(Mode::train);
    ex.backward(loss);
  }
};

}  // namespace

TEST_CASE("a tied parameter is stored once and its gradient sums both users") {
  TwoLinear tied(true), untied(false);
  CHECK(tied.g.num_params() == 36 + 6);
  CHECK(untied.g.num_params() == 36 + 36 + 6);
  Executor a(tied.g), b(untied.g);
  a.initialize(3);
  b.initialize(3);
  // The untied graph gets the tied weights in both places.
  const Tensor w = a.params().view("fc1.weight");
  for (const char* name : {"fc1.weight", "fc2.weight"}) {
    Tensor dst = b.params().view(name);
    std::copy_n(w.data<float>(), w.numel(), dst.data<float>());
  }
  Tensor bias = b.params().view("fc2.bias");
  std::copy_n(a.params().view("fc2.bias").data<float>(), 6, bias.data<float>());
  tied.run(a);
  untied.run(b);
  CHECK(a.value(tied.loss).data<float>()[0] == b.value(untied.loss).data<float>()[0]);
  const std::vector<float> g = copy_of(a.grads().view("fc1.weight"));
  const std::vector<float> g1 = copy_of(b.grads().view("fc1.weight"));
  const std::vector<float> g2 = copy_of(b.grads().view("fc2.weight"));
  double norm2 = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(g[i] == doctest::Approx(g1[i] + g2[i]).epsilon(1e-6));
    norm2 += double(g2[i]) * g2[i];
  }
  CHECK(norm2 > 1e-6);  // both users contribute something
}

TEST_CASE("grad_ready fires once for a tied parameter, after its last contribution") {
  TwoLinear m(true);
  Executor ex(m.g);
  ex.initialize(3);
  std::vector<int> ready;
  std::vector<float> at_ready;
  int fc1_backward_done = -1;  // position in `ready` when fc1's backward began
  ex.hooks.pre_op = [&](int node, Phase p) {
    if (p == Phase::backward && m.g.nodes()[static_cast<size_t>(node)].name == "fc1")
      fc1_backward_done = static_cast<int>(ready.size());
  };
  ex.hooks.grad_ready = [&](int param) {
    ready.push_back(param);
    if (param == m.g.param_index("fc1.weight")) at_ready = copy_of(ex.grads().view(param));
  };
  m.run(ex);
  const int w = m.g.param_index("fc1.weight"), bias = m.g.param_index("fc2.bias");
  REQUIRE(ready.size() == 2);
  CHECK(ready[0] == bias);  // fc2 ran backward first; its own bias is final then
  CHECK(ready[1] == w);     // the shared weight only after fc1 (its first user) added in
  CHECK(fc1_backward_done == 1);
  CHECK(at_ready == copy_of(ex.grads().view(w)));
}

// GPT-2's tie: ids -> token_embedding -> head (linear to the vocabulary, its weight
// the word table) -> cross-entropy. The head is the table's first user in backward
// order; the embedding, a later one, scatter-adds straight into the gradient
// (can_accumulate_param_grad) rather than through a temporary. Same sum either way;
// in bf16 too, where the half table's gradient is kept in f32 by the embedding itself
// (param_grad_in_f32: the head's is widened from bf16 first, the rows added onto it).
TEST_CASE("an embedding tied to the output head adds its gradient in place") {
  const EmbeddingDims d{7, 3, 0, 4, 0.5};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    auto build = [&](Graph& g, bool tied, ValueId& ids, ValueId& labels) {
      g.set_policy({dtype});
      ids = g.input("ids", {2, 3}, DType::i32);
      labels = g.input("labels", {2, 3}, DType::i32);
      const ValueId h = g.add1("embed", token_embedding(d), {ids});
      std::vector<Tie> ties;
      if (tied) ties.push_back({0, g.param_index("embed.word_embeddings.weight")});
      const ValueId logits = g.add1("head", linear(4, 7, Bias::no), {h}, ties);
      return g.add1("loss", softmax_cross_entropy(), {logits, labels});
    };
    Graph tg, ug;
    ValueId tids, tlab, uids, ulab;
    const ValueId tloss = build(tg, true, tids, tlab), uloss = build(ug, false, uids, ulab);
    Executor a(tg), b(ug);
    a.initialize(4);
    b.initialize(4);
    const Tensor w = a.params().view("embed.word_embeddings.weight");
    for (const char* name : {"embed.word_embeddings.weight", "head.weight"}) {
      Tensor dst = b.params().view(name);
      REQUIRE(dst.nbytes() == w.nbytes());
      std::memcpy(dst.raw(), w.raw(), w.nbytes());
    }
    Tensor pos = b.params().view("embed.position_embeddings.weight");
    std::memcpy(pos.raw(), a.params().view("embed.position_embeddings.weight").raw(), pos.nbytes());
    Tensor ids = Tensor::empty({2, 3}, DType::i32), labels = Tensor::empty({2, 3}, DType::i32);
    const int32_t id_values[] = {1, 5, 1, 6, 0, 5}, label_values[] = {5, 1, 6, 0, 5, 2};
    std::copy_n(id_values, 6, ids.data<int32_t>());
    std::copy_n(label_values, 6, labels.data<int32_t>());
    for (auto [ex, x, y, loss] : {std::tuple{&a, tids, tlab, tloss}, {&b, uids, ulab, uloss}}) {
      ex->set_input(x, ids);
      ex->set_input(y, labels);
      ex->forward(Mode::train);
      ex->backward(loss);
    }
    const std::vector<float> g = copy_of(a.grads().view("embed.word_embeddings.weight"));
    const std::vector<float> g_embed = copy_of(b.grads().view("embed.word_embeddings.weight"));
    const std::vector<float> g_head = copy_of(b.grads().view("head.weight"));
    double embed_norm = 0, head_norm = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      CAPTURE(i);
      // f32 sums of the same terms, in another order where an id repeats
      CHECK(std::fabs(g[i] - (g_embed[i] + g_head[i])) <=
            1e-6 * (1.0 + std::fabs(g_embed[i]) + std::fabs(g_head[i])));
      embed_norm += double(g_embed[i]) * g_embed[i];
      head_norm += double(g_head[i]) * g_head[i];
    }
    CHECK(embed_norm > 1e-6);  // the embedding's rows did contribute
    CHECK(head_norm > 1e-6);   // and so did the head, which the tied sum kept
  }
}

TEST_CASE("a tie of mismatched shape is an error naming both nodes") {
  Graph g;
  const ValueId x = g.input("x", {2, 4}, DType::f32);
  const ValueId h = g.add1("embed_proj", linear(4, 8, Bias::no), {x});
  CHECK_THROWS_WITH_AS(
      g.add1("head", linear(8, 8, Bias::no), {h}, {{0, g.param_index("embed_proj.weight")}}),
      doctest::Contains("\"head\": parameter weight f32[8, 8] cannot be tied to "
                        "\"embed_proj.weight\" of node \"embed_proj\", which is f32[8, 4]"),
      Error);
  CHECK_THROWS_WITH_AS(g.param_index("nope.weight"), doctest::Contains("nope.weight"), Error);
}

TEST_CASE("patchify + linear equals Conv2d(kernel = stride = P) with the weight reshaped") {
  const int64_t N = 2, C = 3, H = 8, W = 12, P = 4, K = 5;
  Graph g;
  const ValueId x = g.input("x", {N, C, H, W}, DType::f32);
  const ValueId patches = g.add1("patchify", patchify(P), {x});
  const ValueId lin = g.add1("proj", linear(C * P * P, K, Bias::yes), {patches});
  const ValueId conv = g.add1("conv", conv2d(C, K, P, P, 0, 1, 1, Bias::yes), {x});
  CHECK(g.value(patches).spec.shape == Shape{N, (H / P) * (W / P), C * P * P});
  Executor ex(g);
  ex.initialize(5);
  // conv.weight [K, C, P, P] and proj.weight [K, C*P*P] share one memory order.
  Tensor cw = ex.params().view("conv.weight"), cb = ex.params().view("conv.bias");
  std::copy_n(ex.params().view("proj.weight").data<float>(), cw.numel(), cw.data<float>());
  std::copy_n(ex.params().view("proj.bias").data<float>(), K, cb.data<float>());
  ex.set_input(x, ramp({N, C, H, W}, 0.31f, 0.0f));
  ex.forward(Mode::eval);
  const Tensor& a = ex.value(lin);   // [N, Hp*Wp, K]
  const Tensor& b = ex.value(conv);  // [N, K, Hp, Wp]
  const int64_t tokens = (H / P) * (W / P);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t k = 0; k < K; ++k) {
        CHECK(a.data<float>()[(n * tokens + t) * K + k] ==
              doctest::Approx(b.data<float>()[(n * K + k) * tokens + t]).epsilon(1e-5));
      }
  Graph bad;
  const ValueId y = bad.input("y", {1, 1, 28, 28}, DType::f32);
  CHECK_THROWS_WITH_AS(bad.add1("patchify", patchify(5), {y}),
                       doctest::Contains("patch size 5 does not divide the 28x28 image"), Error);
}

TEST_CASE("token embedding: word + position + type-0 rows, and ids are checked") {
  Graph g;
  const ValueId ids = g.input("ids", {2, 3}, DType::i32);
  const ValueId e = g.add1("embeddings", token_embedding({10, 4, 2, 5}), {ids});
  CHECK(g.num_params() == (10 + 4 + 2) * 5);
  Executor ex(g);
  ex.initialize(1);
  Tensor t = Tensor::empty({2, 3}, DType::i32);
  const int32_t id[6] = {3, 0, 9, 9, 1, 3};
  std::copy_n(id, 6, t.data<int32_t>());
  ex.set_input(ids, t);
  ex.forward(Mode::train);
  const float* word = ex.params().view("embeddings.word_embeddings.weight").data<float>();
  const float* pos = ex.params().view("embeddings.position_embeddings.weight").data<float>();
  const float* type = ex.params().view("embeddings.token_type_embeddings.weight").data<float>();
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < 5; ++c) {
      const float want = word[id[i] * 5 + c] + pos[(i % 3) * 5 + c] + type[c];
      CHECK(ex.value(e).data<float>()[i * 5 + c] == doctest::Approx(want).epsilon(1e-6));
    }
  t.data<int32_t>()[4] = 10;
  CHECK_THROWS_WITH_AS(ex.forward(Mode::train), doctest::Contains("id 10 at position 4"), Error);
  Graph too_long;
  const ValueId long_ids = too_long.input("ids", {1, 5}, DType::i32);
  CHECK_THROWS_WITH_AS(too_long.add1("embeddings", token_embedding({10, 4, 0, 5}), {long_ids}),
                       doctest::Contains("5 tokens but only 4 position embeddings"), Error);
}

TEST_CASE("self_attention with a key-padding mask ignores the padded tokens") {
  const int64_t B = 2, T = 4, C = 8;
  Graph g;
  const ValueId qkv = g.input("qkv", {B, T, 3 * C}, DType::f32);
  const ValueId mask = g.input("mask", {B, T}, DType::u8);
  const ValueId y =
      g.add1("attn", self_attention(2, kernels::Causal::no, KeyMask::input), {qkv, mask});
  Executor ex(g);
  Tensor m = Tensor::empty({B, T}, DType::u8);
  for (int i = 0; i < B * T; ++i) m.data<uint8_t>()[i] = (i % T) < 3 ? 1 : 0;  // token 3 is padding
  Tensor x = ramp({B, T, 3 * C}, 0.43f, 0.0f);
  ex.set_input(qkv, x);
  ex.set_input(mask, m);
  ex.forward(Mode::eval);
  const std::vector<float> before = copy_of(ex.value(y));
  for (int64_t b = 0; b < B; ++b)  // change the padded token's keys and values
    for (int64_t c = C; c < 3 * C; ++c) x.data<float>()[(b * T + 3) * 3 * C + c] += 5.0f;
  ex.forward(Mode::eval);
  CHECK(copy_of(ex.value(y)) == before);
  Graph bad;
  const ValueId q2 = bad.input("qkv", {B, T, 3 * C}, DType::f32);
  const ValueId m2 = bad.input("mask", {B, T}, DType::f32);
  CHECK_THROWS_WITH_AS(
      bad.add1("attn", self_attention(2, kernels::Causal::no, KeyMask::input), {q2, m2}),
      doctest::Contains("key mask must be u8 [2, 4]"), Error);
}

// A bf16 linear layer's weight gradient is its GEMM's f32 output (Op::param_grad_in_f32):
// the bf16 products summed in f32 and kept so, not rounded to bf16 and widened (which
// would leave the low 16 bits of every f32 value zero); a tied weight's later user adds
// its part in f32 too, giving the untied users' sum.
TEST_CASE("a bf16 linear writes its weight gradient in f32, and a tied one adds in f32") {
  auto build = [](Graph& g, bool tied, ValueId& x, ValueId& labels) {
    g.set_policy({DType::bf16});
    x = g.input("x", {4, 6}, DType::bf16);
    labels = g.input("labels", {4}, DType::i32);
    ValueId h = g.add1("fc1", linear(6, 6, Bias::no), {x});
    std::vector<Tie> ties;
    if (tied) ties.push_back({0, g.param_index("fc1.weight")});
    h = g.add1("fc2", linear(6, 6, Bias::no), {h}, ties);
    return g.add1("loss", softmax_cross_entropy(), {h, labels});
  };
  Graph tg, ug;
  ValueId tx, tl, ux, ul;
  const ValueId tloss = build(tg, true, tx, tl), uloss = build(ug, false, ux, ul);
  Executor a(tg), b(ug);
  a.initialize(5);
  b.initialize(5);
  const Tensor w = a.params().view("fc1.weight");
  for (const char* name : {"fc1.weight", "fc2.weight"}) {
    Tensor dst = b.params().view(name);
    REQUIRE(dst.nbytes() == w.nbytes());
    std::memcpy(dst.raw(), w.raw(), w.nbytes());
  }
  Tensor x = Tensor::empty({4, 6}, DType::bf16);
  kernels::cast(ramp({4, 6}, 0.7f, 0.1f), x);
  for (auto [ex, in, lab, loss] : {std::tuple{&a, tx, tl, tloss}, {&b, ux, ul, uloss}}) {
    ex->set_input(in, x);
    ex->set_input(lab, labels_of(4, 6));
    ex->forward(Mode::train);
    ex->backward(loss);
  }
  const std::vector<float> g = copy_of(a.grads().view("fc1.weight"));
  const std::vector<float> g1 = copy_of(b.grads().view("fc1.weight"));
  const std::vector<float> g2 = copy_of(b.grads().view("fc2.weight"));
  int wide1 = 0, wide = 0;  // values that bf16 cannot hold
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(g[i] - (g1[i] + g2[i])) <= 1e-6 * (1.0 + std::fabs(g1[i]) + std::fabs(g2[i])));
    uint32_t bits1 = 0, bits = 0;
    std::memcpy(&bits1, &g1[i], 4);
    std::memcpy(&bits, &g[i], 4);
    wide1 += (bits1 & 0xffffu) != 0;
    wide += (bits & 0xffffu) != 0;
  }
  MESSAGE(wide1, " and ", wide, " of ", g.size(), " gradient values beyond bf16's precision");
  CHECK(wide1 > static_cast<int>(g.size()) / 2);
  CHECK(wide > static_cast<int>(g.size()) / 2);
}
