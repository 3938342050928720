// Pipeline stages in one process: the stage plan (graph/stages.h) and executors that
// each run one stage's nodes (Executor::set_range) with several micro-batches in
// flight (slots), handing activations forward and gradients back as copies (what a
// send would deliver). Against one executor over the whole graph with the same
// micro-batches accumulated: losses, every parameter gradient and the batch-norm
// statistics bit for bit, for the GPipe order (all forwards, then all backwards) and
// the 1F1B order (a stage starts backward as soon as it can), with dropout on.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <set>

#include "graph/executor.h"
#include "graph/stages.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "models/registry.h"

using namespace dtrain;
using namespace dtrain::models;

namespace {

ModelOptions tiny(const char* arch) {
  ModelOptions o = preset_options(*find_arch(arch));
  if (std::string(arch) == "resnet18") {
    o.width = 0.25;
    o.image_size = 16;
    o.in_channels = 1;
    o.num_classes = 10;
    o.stem = ResNetStem::small;
    return o;
  }
  o.layers = 4;
  o.hidden = 16;
  o.heads = 2;
  o.ffn = 32;
  o.dropout = 0.1;
  if (o.vocab_size) {
    o.vocab_size = 50;
    o.seq_len = 8;
    o.max_positions = 12;
    o.mlm_predictions = 4;
    if (std::string(arch).rfind("bert", 0) == 0) o.num_classes = 3;  // no decoder tied across
  } else {
    o.image_size = 8;
    o.patch_size = 4;
    o.in_channels = 2;
    o.num_classes = 5;
  }
  return o;
}

// Micro-batch m's inputs, different per m.
void feed(graph::Executor& ex, const ModelGraph& g, int m) {
  const graph::Value& in = g.graph.value(g.input);
  const graph::Value& lab = g.graph.value(g.labels);
  Tensor x = Tensor::empty(in.spec.shape, in.spec.dtype);
  Tensor y = Tensor::empty(lab.spec.shape, DType::i32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (in.spec.dtype == DType::i32) {
      x.data<int32_t>()[i] = static_cast<int32_t>((7 * i + 3 + 5 * m) % 50);
    } else {
      x.data<float>()[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(m)) + 0.1f;
    }
  }
  const Shape& logits = g.graph.value(g.logits).spec.shape;
  const int64_t classes = logits[logits.rank() - 1];
  for (int64_t i = 0; i < y.numel(); ++i) {
    y.data<int32_t>()[i] = static_cast<int32_t>((11 * i + 5 + m) % classes);
    // Language models: only some positions labelled (BERT's masked-LM convention).
    if (lab.spec.shape.rank() == 2 && (i + m) % 3 != 0) y.data<int32_t>()[i] = -100;
  }
  ex.set_input(g.input, x);
  ex.set_input(g.labels, y);
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  kernels::copy(t, c);
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The executor's gradients summed into `acc` (the whole f32 layout, zeros where another
// stage's parameters are: a stage's executor holds its own alone).
void accumulate(graph::Executor& ex, Tensor& acc, int m) {
  const graph::FlatStore& grads = ex.grads();
  if (m == 0) {
    acc = Tensor::empty({grads.buffer_elems(DType::f32)}, DType::f32);
    kernels::fill(acc, 0.0f);
  }
  for (int p = 0; p < grads.size(); ++p) {
    if (!grads.held(p)) continue;
    const graph::FlatEntry& e = grads.entries()[static_cast<size_t>(p)];
    Tensor dst = acc.view(e.offset, e.spec.shape);
    kernels::axpy(1.0f, grads.view(p), dst);
  }
}

constexpr int kMicro = 4;
constexpr int64_t kBatch = 2;

struct Reference {
  std::vector<float> losses;
  Tensor grads, buffers;
};

Reference one_executor(const ModelGraph& g) {
  graph::Executor ex(g.graph);
  ex.initialize(7);
  Reference r;
  for (int m = 0; m < kMicro; ++m) {
    feed(ex, g, m);
    ex.forward(graph::Mode::train, 3, {static_cast<uint64_t>(m * kBatch), kBatch});
    ex.backward(g.loss, 2.0f);
    r.losses.push_back(ex.value(g.loss).data<float>()[0]);
    accumulate(ex, r.grads, m);
  }
  r.buffers = ex.buffers().flat(DType::f32);
  if (r.buffers.defined()) r.buffers = copy_of(r.buffers);
  return r;
}

// The stages of `g`, one executor each, run in `order`: (stage, micro-batch, forward?)
// events, each stage's events in its schedule's order.
struct Event {
  int stage, micro;
  bool forward;
};

void run_stages(const ModelGraph& g, const std::vector<graph::Stage>& stages,
                const std::vector<Event>& order, const Reference& want) {
  const size_t P = stages.size();
  std::vector<std::unique_ptr<graph::Executor>> ex;
  for (const graph::Stage& s : stages) {  // each holds the parameters its nodes use
    ex.push_back(std::make_unique<graph::Executor>(g.graph, Device::cpu(), graph::GradBuffer::owned,
                                                   graph::ParamBuffer::owned,
                                                   std::pair<int, int>{s.begin, s.end}));
    const std::vector<char> used = graph::stage_params(g.graph, s);
    for (int p = 0; p < ex.back()->params().size(); ++p) {
      const bool mine = used[static_cast<size_t>(p)] != 0;
      CHECK(ex.back()->params().held(p) == mine);
      CHECK(ex.back()->grads().held(p) == mine);
      if (!mine) CHECK_THROWS_AS(ex.back()->params().view(p), InternalError);
    }
    ex.back()->set_slots(kMicro);
    ex.back()->initialize(7);
  }
  // In flight: (stage that receives, micro-batch) -> the sent copies.
  std::map<std::pair<size_t, int>, std::vector<Tensor>> acts, grads;
  std::vector<Tensor> acc(P);
  std::vector<int> backwards(P, 0);
  std::vector<float> losses(kMicro, 0.0f);
  for (const Event& e : order) {
    const auto s = static_cast<size_t>(e.stage);
    graph::Executor& x = *ex[s];
    x.select_slot(e.micro);
    if (e.forward) {
      feed(x, g, e.micro);
      if (s > 0) {
        const std::vector<Tensor> in = acts.at({s, e.micro});
        for (size_t k = 0; k < in.size(); ++k) x.set_value(stages[s].receives[k], in[k]);
      }
      x.forward(graph::Mode::train, 3, {static_cast<uint64_t>(e.micro * kBatch), kBatch});
      if (s + 1 < P) {
        std::vector<Tensor> out;
        for (graph::ValueId v : stages[s + 1].receives) out.push_back(copy_of(x.value(v)));
        acts[{s + 1, e.micro}] = out;
        x.release_unused();
      }
      continue;
    }
    std::vector<std::pair<graph::ValueId, Tensor>> seeds;
    if (s + 1 < P) {
      const std::vector<Tensor>& back = grads.at({s, e.micro});
      for (size_t k = 0; k < back.size(); ++k)
        if (back[k].defined()) seeds.emplace_back(stages[s + 1].receives[k], back[k]);
    }
    x.backward(seeds, s + 1 == P ? g.loss : -1, 2.0f);
    if (s + 1 == P) losses[static_cast<size_t>(e.micro)] = x.value(g.loss).data<float>()[0];
    if (s > 0) {
      std::vector<Tensor> back;
      for (graph::ValueId v : stages[s].receives) {
        const Tensor t = x.take_grad(v);
        back.push_back(t.defined() ? copy_of(t) : Tensor());
      }
      grads[{s - 1, e.micro}] = back;
    }
    CHECK(e.micro == backwards[s]);  // backward in micro-batch order: the same sums
    accumulate(x, acc[s], backwards[s]++);
  }
  for (int m = 0; m < kMicro; ++m)
    CHECK(losses[static_cast<size_t>(m)] == want.losses[static_cast<size_t>(m)]);
  // Each parameter's gradient from the stage that uses it; each buffer from its node's
  // (offsets: the flat stores', f32).
  const auto& layout = ex[0]->grads().entries();
  for (size_t p = 0; p < layout.size(); ++p) {
    size_t owner = P;
    for (size_t s = 0; s < P; ++s)
      for (int i = stages[s].begin; i < stages[s].end; ++i)
        for (int q : g.graph.nodes()[static_cast<size_t>(i)].params)
          if (q == static_cast<int>(p)) owner = s;
    REQUIRE(owner < P);
    const int64_t n = layout[p].spec.shape.numel();
    CHECK_MESSAGE(
        same_bits(acc[owner].view(layout[p].offset, {n}), want.grads.view(layout[p].offset, {n})),
        layout[p].name);
  }
  if (want.buffers.defined()) {
    for (const graph::FlatEntry& b : ex[0]->buffers().entries()) {
      size_t owner = 0;
      for (size_t s = 0; s < P; ++s)
        if (b.node >= stages[s].begin && b.node < stages[s].end) owner = s;
      const int64_t n = b.spec.shape.numel();
      const Tensor mine = ex[owner]->buffers().flat(DType::f32);
      CHECK_MESSAGE(same_bits(mine.view(b.offset, {n}), want.buffers.view(b.offset, {n})), b.name);
    }
  }
}

std::vector<Event> gpipe(int P) {
  std::vector<Event> out;
  for (int m = 0; m < kMicro; ++m)
    for (int s = 0; s < P; ++s) out.push_back({s, m, true});
  for (int m = 0; m < kMicro; ++m)
    for (int s = P - 1; s >= 0; --s) out.push_back({s, m, false});
  return out;
}

// 1F1B, serialised: stage s runs P - s - 1 warm-up forwards, then alternates one
// forward and one backward, then drains; the events are ordered so that every
// event's input exists (a stage's backward after the next stage's).
std::vector<Event> one_f_one_b(int P) {
  std::vector<std::vector<Event>> per(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    const int warm = std::min(P - s - 1, kMicro);
    int f = 0, b = 0;
    for (; f < warm; ++f) per[static_cast<size_t>(s)].push_back({s, f, true});
    while (b < kMicro) {
      if (f < kMicro) per[static_cast<size_t>(s)].push_back({s, f++, true});
      per[static_cast<size_t>(s)].push_back({s, b++, false});
    }
  }
  // Round-robin over the stages, taking an event when its input is there.
  std::vector<Event> out;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::set<std::tuple<int, int, bool>> done;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      auto& q = per[static_cast<size_t>(s)];
      size_t& i = next[static_cast<size_t>(s)];
      if (i == q.size()) continue;
      const Event e = q[i];
      const bool ready = e.forward ? (s == 0 || done.count({s - 1, e.micro, true}))
                                   : (s == P - 1 || done.count({s + 1, e.micro, false}));
      if (!ready) continue;
      out.push_back(e);
      done.insert({s, e.micro, e.forward});
      ++i;
      progress = true;
    }
  }
  CHECK(out.size() == static_cast<size_t>(2 * kMicro * P));
  return out;
}

}  // namespace

TEST_CASE("pipeline stages: cut at blocks, balanced by FLOPs, with what crosses each cut") {
  const ModelGraph g = build_model(tiny("gpt2-tiny"), kBatch, {});
  const std::vector<graph::Stage> s = graph::plan_stages(g.graph, 2);
  REQUIRE(s.size() == 2);
  CHECK(s[0].begin == 0);
  CHECK(s[0].end == s[1].begin);
  CHECK(s[1].end == static_cast<int>(g.graph.nodes().size()));
  CHECK(s[0].first_block == 0);
  CHECK(s[1].end_block == g.graph.num_blocks());
  CHECK(s[0].end_block == s[1].first_block);
  CHECK(s[0].receives.empty());
  CHECK_FALSE(s[1].receives.empty());
  // The 4 layers alone would split 2 + 2; the LM head's FLOPs make the last stage heavier,
  // so the cut moves up a layer.
  CHECK(s[1].first_block <= 2);
  // GPT-2 ties the token embedding (stage 0) to the LM head (the last stage).
  const std::vector<int> tied = graph::params_across_stages(g.graph, s);
  REQUIRE(tied.size() == 1);
  CHECK(g.graph.param_layout()[static_cast<size_t>(tied[0])].name.find("word_embeddings") !=
        std::string::npos);
  CHECK(graph::format_stages(g.graph, s).find("stage 1: blocks") != std::string::npos);
  // By hand, and refused shapes.
  const std::vector<graph::Stage> h = graph::stages_from_blocks(g.graph, {3, 1});
  CHECK(h[1].first_block == 3);
  CHECK_THROWS_AS(graph::stages_from_blocks(g.graph, {3, 2}), Error);
  CHECK_THROWS_AS(graph::stages_from_blocks(g.graph, {4, 0}), Error);
  CHECK_THROWS_AS(graph::plan_stages(g.graph, 5), Error);
}

TEST_CASE("pipeline stages compute what one executor computes, bit for bit, GPipe and 1F1B") {
  for (const char* arch : {"resnet18", "vit-tiny", "bert-mini"}) {
    CAPTURE(arch);
    const ModelGraph g = build_model(tiny(arch), kBatch, {});
    const Reference want = one_executor(g);
    for (int P : {2, 3}) {
      CAPTURE(P);
      const std::vector<graph::Stage> stages = graph::plan_stages(g.graph, P);
      REQUIRE(graph::params_across_stages(g.graph, stages).empty());
      run_stages(g, stages, gpipe(P), want);
      run_stages(g, stages, one_f_one_b(P), want);
    }
  }
}
