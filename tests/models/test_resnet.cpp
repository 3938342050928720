// ResNet builders against torchvision: exact parameter counts and state-dict
// names, FLOPs, stem shapes, width multiplier, initialisation (zero-init
// residual gammas, Kaiming fan_out), and a tiny ResNet-18 through forward and
// backward on the CPU executor. Nothing here is timed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>

#include "graph/executor.h"
#include "graph/layouts.h"
#include "graph/ops.h"
#include "kernels/conv.h"
#include "models/registry.h"
#include "models/resnet.h"

using namespace dtrain;
using namespace dtrain::models;

namespace {

ModelOptions preset(const char* arch) { return preset_options(*find_arch(arch)); }

// ResNet-18, small stem, width 0.25, 1 x 28 x 28 inputs, 10 classes.
ModelOptions tiny() {
  ModelOptions o = preset("resnet18");
  o.stem = ResNetStem::small;
  o.width = 0.25;
  o.image_size = 28;
  o.in_channels = 1;
  o.num_classes = 10;
  return o;
}

const graph::Value& output_of(const graph::Graph& g, const std::string& node) {
  for (const graph::Node& n : g.nodes())
    if (n.name == node) return g.value(n.outputs.at(0));
  FAIL("no node named " << node);
  return g.value(0);
}

bool has_node(const graph::Graph& g, const std::string& node) {
  return std::any_of(g.nodes().begin(), g.nodes().end(),
                     [&](const graph::Node& n) { return n.name == node; });
}

const graph::FlatEntry& param(const graph::Graph& g, const std::string& name) {
  for (const graph::FlatEntry& e : g.param_layout())
    if (e.name == name) return e;
  FAIL("no parameter named " << name);
  return g.param_layout().front();
}

void feed(graph::Executor& ex, const ModelGraph& m, const Shape& x_shape, int classes) {
  Tensor x = Tensor::empty(x_shape, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.37f * i) + 0.1f;
  Tensor y = Tensor::empty({x_shape[0]}, DType::i32);
  for (int64_t i = 0; i < x_shape[0]; ++i)
    y.data<int32_t>()[i] = static_cast<int32_t>(3 * i + 1) % classes;
  ex.set_input(m.input, x);
  ex.set_input(m.labels, y);
}

float max_abs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.data<float>()[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("parameter counts match torchvision at 1000 classes, 224 px, 3 channels") {
  const std::pair<const char*, int64_t> expected[] = {{"resnet18", 11'689'512},
                                                      {"resnet34", 21'797'672},
                                                      {"resnet50", 25'557'032},
                                                      {"resnet101", 44'549'160},
                                                      {"resnet152", 60'192'808}};
  for (const auto& [arch, params] : expected) {
    CAPTURE(arch);
    CHECK(summarize(preset(arch)).params == params);
  }
}

TEST_CASE("parameter and buffer names are torchvision's state-dict keys") {
  const ModelGraph m = build_model(preset("resnet50"), 1);
  const auto& p = m.graph.param_layout();
  CHECK(p.size() == 161);  // len(list(torchvision.models.resnet50().parameters()))
  CHECK(p.front().name == "conv1.weight");
  CHECK(p[1].name == "bn1.weight");
  CHECK(p[3].name == "layer1.0.conv1.weight");
  CHECK(p.back().name == "fc.bias");
  CHECK(param(m.graph, "layer1.0.downsample.0.weight").spec.shape == Shape{256, 64, 1, 1});
  CHECK(param(m.graph, "layer1.0.downsample.1.bias").spec.shape == Shape{256});
  CHECK(param(m.graph, "layer4.2.conv3.weight").spec.shape == Shape{2048, 512, 1, 1});
  CHECK(param(m.graph, "fc.weight").spec.shape == Shape{1000, 2048});
  // v1.5: the stride sits on the 3x3 conv, so conv1 of layer2.0 keeps 56 x 56.
  CHECK(output_of(m.graph, "layer2.0.conv1").spec.shape == Shape{1, 128, 56, 56});
  CHECK(output_of(m.graph, "layer2.0.conv2").spec.shape == Shape{1, 128, 28, 28});
  CHECK(m.graph.buffer_layout().front().name == "bn1.running_mean");
  CHECK(m.graph.value(m.logits).spec.shape == Shape{1, 1000});
  CHECK(m.graph.value(m.loss).spec.shape == Shape{1});
}

TEST_CASE("ResNet-50 forward is ~4.09 GMACs = ~8.18 GFLOPs per sample at 224 px") {
  const ModelGraph m = build_model(preset("resnet50"), 2);
  double dense = 0;  // convolutions and fc: 2 FLOPs per multiply-add
  for (const graph::Node& n : m.graph.nodes()) {
    if (n.op->kind() == "conv2d" || n.op->kind() == "linear") dense += n.info.flops;
  }
  CHECK(dense / 2 == doctest::Approx(2 * 4.089184256e9));  // exact: sum of K*C*R*S*OH*OW
  // Everything else (batch-norm, ReLU, adds, pooling, loss) adds about 1.5%.
  const double total = m.graph.forward_flops() / 2;
  CHECK(total > dense / 2);
  CHECK(total == doctest::Approx(8.2e9).epsilon(0.03));
}

TEST_CASE("stems: standard is /4 before layer1, small keeps 28 px inputs at full size") {
  const ModelGraph standard = build_model(preset("resnet18"), 1);
  CHECK(output_of(standard.graph, "conv1").spec.shape == Shape{1, 64, 112, 112});
  CHECK(output_of(standard.graph, "maxpool").spec.shape == Shape{1, 64, 56, 56});
  CHECK(output_of(standard.graph, "layer4.1.relu").spec.shape == Shape{1, 512, 7, 7});
  CHECK(param(standard.graph, "conv1.weight").spec.shape == Shape{64, 3, 7, 7});

  const ModelGraph small = build_model(tiny(), 2);
  CHECK_FALSE(has_node(small.graph, "maxpool"));
  CHECK(param(small.graph, "conv1.weight").spec.shape == Shape{16, 1, 3, 3});
  CHECK(output_of(small.graph, "bn1").spec.shape == Shape{2, 16, 28, 28});  // with its ReLU
  CHECK_FALSE(has_node(small.graph, "relu"));
  CHECK(output_of(small.graph, "layer1.1.relu").spec.shape == Shape{2, 16, 28, 28});
  CHECK(output_of(small.graph, "layer2.1.relu").spec.shape == Shape{2, 32, 14, 14});
  CHECK(output_of(small.graph, "layer3.1.relu").spec.shape == Shape{2, 64, 7, 7});
  CHECK(output_of(small.graph, "layer4.1.relu").spec.shape == Shape{2, 128, 4, 4});
  CHECK(small.graph.value(small.logits).spec.shape == Shape{2, 10});
}

TEST_CASE("width multiplies every channel count, rounded, at least 1") {
  CHECK(scaled_width(512, 0.3) == 154);  // 153.6
  CHECK(scaled_width(256, 0.3) == 77);   // 76.8
  CHECK(scaled_width(64, 0.3) == 19);    // 19.2
  CHECK(scaled_width(64, 0.001) == 1);
  ModelOptions half = preset("resnet18");
  half.width = 0.5;
  CHECK(summarize(half).params == 3'055'880);
  ModelOptions small50 = preset("resnet50");
  small50.width = 0.5;
  small50.stem = ResNetStem::small;
  small50.in_channels = 1;
  small50.num_classes = 10;
  small50.image_size = 32;
  CHECK(summarize(small50).params == 5'898'474);
  CHECK(summarize(tiny()).params == 701'178);
  half.width = 0.0;
  CHECK_THROWS_WITH_AS(build_model(half, 1), doctest::Contains("model.width"), Error);
}

TEST_CASE("init: the last BN gamma of each block is zero, other gammas one, convs fan_out") {
  ModelOptions o = preset("resnet50");
  const std::regex last_bn(R"(layer\d\.\d+\.bn3\.weight)");
  const std::regex any_gamma(R"(.*bn\d\.weight|.*downsample\.1\.weight)");
  for (bool zero : {true, false}) {
    o.zero_init_residual = zero;
    const ModelGraph m = build_model(o, 1);
    int zeros = 0, gammas = 0;
    for (const graph::FlatEntry& e : m.graph.param_layout()) {
      CAPTURE(e.name);
      if (std::regex_match(e.name, any_gamma)) {
        ++gammas;
        const bool want_zero = zero && std::regex_match(e.name, last_bn);
        CHECK(e.spec.init == (want_zero ? graph::InitKind::zeros : graph::InitKind::ones));
        zeros += want_zero;
      }
      if (e.spec.shape.rank() == 4) {  // conv weight [K, C, R, S]: Kaiming normal, fan_out
        CHECK(e.spec.init == graph::InitKind::kaiming_normal);
        CHECK(e.spec.fan_in == e.spec.shape[0] * e.spec.shape[2] * e.spec.shape[3]);
        CHECK(e.spec.group == graph::ParamGroup::weight);
      }
    }
    CHECK(gammas == 53);  // 1 stem + 16 blocks x 3 + 4 downsample
    CHECK(zeros == (zero ? 16 : 0));
  }
}

TEST_CASE("tiny ResNet-18 runs forward and backward with finite loss and expected gradients") {
  for (bool zero : {true, false}) {
    CAPTURE(zero);
    ModelOptions o = tiny();
    o.zero_init_residual = zero;
    const ModelGraph m = build_model(o, 2);
    graph::Executor ex(m.graph);
    ex.initialize(7);
    CHECK(max_abs(ex.params().view("layer1.0.bn2.weight")) == (zero ? 0.0f : 1.0f));
    CHECK(max_abs(ex.params().view("layer1.0.bn1.weight")) == 1.0f);
    CHECK(max_abs(ex.params().view("layer2.0.downsample.1.weight")) == 1.0f);
    feed(ex, m, {2, 1, 28, 28}, 10);
    ex.forward(graph::Mode::train);
    const float loss = ex.value(m.loss).data<float>()[0];
    CHECK(std::isfinite(loss));
    CHECK(loss > 0.0f);
    ex.backward(m.loss);
    // With zero-init, each block's residual branch is multiplied by gamma = 0, so
    // everything in it before that BN gets exactly zero gradient at step 0.
    const std::regex branch(R"(layer\d\.\d\.(conv1|bn1|conv2)\..*)");
    for (int i = 0; i < ex.grads().size(); ++i) {
      const std::string& name = ex.grads().entries()[static_cast<size_t>(i)].name;
      CAPTURE(name);
      const Tensor g = ex.grads().view(i);
      CHECK(all_finite(g));
      if (zero && std::regex_match(name, branch)) {
        CHECK(max_abs(g) == 0.0f);
      } else {
        CHECK(max_abs(g) > 0.0f);
      }
    }
  }
}

TEST_CASE("tiny ResNet-18: Kaiming fan_out init and bit-identical reruns from one seed") {
  const ModelGraph m = build_model(tiny(), 2);
  float losses[2];
  for (float& loss : losses) {
    graph::Executor ex(m.graph);
    ex.initialize(11);
    feed(ex, m, {2, 1, 28, 28}, 10);
    ex.forward(graph::Mode::train);
    loss = ex.value(m.loss).data<float>()[0];
    // layer2.0.conv1 is [32, 16, 3, 3]: fan_out 288 (std 0.083), fan_in 144 (std 0.118).
    const Tensor w = ex.params().view("layer2.0.conv1.weight");
    double sq = 0;
    for (int64_t i = 0; i < w.numel(); ++i) sq += double(w.data<float>()[i]) * w.data<float>()[i];
    const double rms = std::sqrt(sq / static_cast<double>(w.numel()));
    CHECK(std::fabs(rms / std::sqrt(2.0 / 288) - 1) < 0.05);
  }
  CHECK(std::memcmp(&losses[0], &losses[1], sizeof(float)) == 0);
}

TEST_CASE("channel blocks: a ResNet's activations from the stem to the global pool, nothing else") {
  const ModelGraph m = build_model(tiny(), 2);
  const graph::Graph& g = m.graph;
  const int nodes = static_cast<int>(g.nodes().size());
  const std::vector<int32_t> all = graph::channel_blocks(g, 8, {}, 0, nodes);
  int blocked = 0;
  for (const graph::Node& n : g.nodes()) {
    const std::string_view kind = n.op->kind();
    const bool inside = kind == "conv2d" || kind == "batch_norm2d" || kind == "batch_norm2d_relu" ||
                        kind == "add_relu" || kind == "max_pool2d";
    CAPTURE(n.name);
    CHECK(all[static_cast<size_t>(n.outputs[0])] == (inside ? 8 : 0));
    blocked += inside;
  }
  CHECK(blocked > 40);
  CHECK(all[static_cast<size_t>(m.input)] == 0);
  // Pinning bn1's output (batch norm and ReLU) makes its operands plain, and nothing else.
  std::vector<char> pinned(static_cast<size_t>(g.num_values()), 0);
  const graph::ValueId bn1 =
      g.nodes()[static_cast<size_t>(output_of(g, "layer1.0.bn1").producer)].outputs[0];
  pinned[static_cast<size_t>(bn1)] = 1;
  const std::vector<int32_t> some = graph::channel_blocks(g, 8, pinned, 0, nodes);
  int changed = 0;
  for (size_t v = 0; v < some.size(); ++v) changed += some[v] != all[v];
  CHECK(changed == 2);  // conv1's output, bn1's
  CHECK(some[static_cast<size_t>(bn1)] == 0);
  // A range: what crosses its ends stays plain, what lies inside is blocked.
  const int cut = nodes / 2;
  const std::vector<int32_t> first = graph::channel_blocks(g, 8, {}, 0, cut);
  for (int i = 0; i < cut; ++i) {
    const graph::Node& n = g.nodes()[static_cast<size_t>(i)];
    for (graph::ValueId v : n.outputs) {
      bool read_later = false;
      for (int j = cut; j < nodes; ++j)
        for (graph::ValueId u : g.nodes()[static_cast<size_t>(j)].inputs) read_later |= u == v;
      if (read_later) CHECK(first[static_cast<size_t>(v)] == 0);
    }
  }
  CHECK(graph::channel_blocks(g, 0, {}, 0, nodes) == std::vector<int32_t>(all.size(), 0));
}

TEST_CASE("channel blocks: a grouped or biased convolution keeps its operands NCHW") {
  using graph::Bias;
  graph::Graph g;
  const graph::ValueId x = g.input("x", {2, 8, 6, 6}, DType::f32);
  const graph::ValueId a = g.add1("c1", graph::conv2d(8, 16, 3, 1, 1), {x});
  const graph::ValueId b = g.add1("bn1", graph::batch_norm2d_relu(16), {a});
  const graph::ValueId c = g.add1("c2", graph::conv2d(16, 16, 3, 1, 1, 1, 2), {b});  // groups 2
  const graph::ValueId d = g.add1("bn2", graph::batch_norm2d(16), {c});
  const graph::ValueId e = g.add1("c3", graph::conv2d(16, 16, 1, 1, 0, 1, 1, Bias::yes), {d});
  const graph::ValueId f = g.add1("c4", graph::conv2d(16, 16, 1, 1, 0), {e});
  const graph::ValueId h = g.add1("bn4", graph::batch_norm2d_relu(16), {f});
  g.add1("pool", graph::global_avg_pool(), {h});
  const std::vector<int32_t> blocks =
      graph::channel_blocks(g, 8, {}, 0, static_cast<int>(g.nodes().size()));
  // b feeds the grouped conv, so bn1's operands (a, b) stay plain; c, d around bn2 feed or
  // come from a grouped or biased conv; e is the biased conv's output; f and h are free.
  for (graph::ValueId v : {x, a, b, c, d, e}) CHECK(blocks[static_cast<size_t>(v)] == 0);
  for (graph::ValueId v : {f, h}) CHECK(blocks[static_cast<size_t>(v)] == 8);
}

// In f32, and in bf16 where this CPU's oneDNN computes bf16 convolutions in the block
// (kernels::cpu_channel_block(DType::bf16); elsewhere bf16 stays NCHW, and the test says so).
// bf16 values are blocked as f32 ones where the executor says so (bf16: the CPU's oneDNN
// computes them in the block); f16 ones never.
TEST_CASE("channel blocks: bf16 activations when asked, f16 never") {
  for (const DType dt : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dt));
    const ModelGraph m = build_model(tiny(), 2, graph::DTypePolicy{dt});
    const int nodes = static_cast<int>(m.graph.nodes().size());
    const std::vector<int32_t> off = graph::channel_blocks(m.graph, 8, {}, 0, nodes);
    const std::vector<int32_t> on = graph::channel_blocks(m.graph, 8, {}, 0, nodes, true);
    int blocked = 0;
    for (size_t v = 0; v < on.size(); ++v) {
      CHECK(off[v] == 0);
      blocked += on[v] != 0;
      if (on[v] != 0)
        CHECK(m.graph.value(static_cast<graph::ValueId>(v)).spec.dtype == DType::bf16);
    }
    CHECK((blocked > 40) == (dt == DType::bf16));
  }
}

TEST_CASE("tiny ResNet-18: channel-blocked activations give the NCHW run's bits") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    const ModelGraph m = build_model(tiny(), 2, graph::DTypePolicy{dt});
    const int64_t native = kernels::cpu_channel_block();
    const bool blocks = native > 0 && kernels::cpu_channel_block(dt) == native;
    if (!blocks) MESSAGE(dtype_name(dt), ": this CPU's convolutions keep NCHW in that dtype");
    for (int segment : {0, 1}) {
      CAPTURE(segment);
      std::vector<char> bits[2];  // loss, gradients, running statistics, eval logits
      const auto append = [](std::vector<char>& out, const Tensor& t) {
        if (!t.defined()) return;
        const char* p = static_cast<const char*>(t.raw());
        out.insert(out.end(), p, p + t.nbytes());
      };
      for (int64_t block : {int64_t{0}, native}) {
        graph::Executor ex(m.graph);
        ex.set_channel_block(block);
        ex.set_checkpointing(segment);
        ex.keep(m.logits, graph::Mode::eval);
        ex.initialize(5);
        feed(ex, m, {2, 1, 28, 28}, 10);
        int used = 0;
        for (int32_t b : ex.value_blocks()) used += b != 0;
        CHECK((used > 0) == (block > 0 && blocks));
        std::vector<char>& out = bits[block ? 1 : 0];
        ex.forward(graph::Mode::train);
        append(out, ex.value(m.loss));
        ex.backward(m.loss);
        for (const DType t : {DType::f32, DType::bf16}) {
          append(out, ex.grads().flat(t));
          append(out, ex.buffers().flat(t));
        }
        ex.forward(graph::Mode::eval);
        append(out, ex.value(m.logits));
      }
      if (native == 0) MESSAGE("this CPU's convolutions want no channel block: NCHW both times");
      REQUIRE(bits[0].size() == bits[1].size());
      CHECK(bits[0].size() > 1000);
      CHECK(std::memcmp(bits[0].data(), bits[1].data(), bits[0].size()) == 0);
    }
  }
}
