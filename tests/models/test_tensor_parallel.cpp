// Tensor parallelism in one process: graph::split_tensor_parallel on GPT-2, BERT
// masked-LM and ViT, each rank an executor on its own thread and the group's
// all-reduces a barrier between them (ThreadGroup below: each rank adds the ranks'
// buffers in rank order, so every rank gets the same bits, as MPI gives them). Against
// the one-rank graph: every split parameter starts as its part of the whole one, bit
// for bit; the loss and every gradient (a split one against its part of the whole
// gradient) agree within float rounding, with dropout on; replicated gradients are the
// same bits on every rank. The plan: which nodes split how, and what it refuses.
#include <doctest/doctest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>

#include "graph/executor.h"
#include "graph/tensor_parallel.h"
#include "models/registry.h"

using namespace dtrain;
using namespace dtrain::models;

namespace {

// An in-process tensor group of `size` threads.
struct ThreadShared {
  explicit ThreadShared(int n) : size(n), sync(n), slots(static_cast<size_t>(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<Tensor*> slots;
};

class ThreadGroup final : public graph::TensorGroup {
 public:
  ThreadGroup(ThreadShared& shared, int rank) : s_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.size; }
  void all_reduce(Tensor& t, graph::GroupReduce op) override {
    REQUIRE(t.dtype() == DType::f32);
    s_.slots[static_cast<size_t>(rank_)] = &t;
    s_.sync.arrive_and_wait();
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v = s_.slots[0]->data<float>()[i];
      for (int r = 1; r < s_.size; ++r) {
        const float x = s_.slots[static_cast<size_t>(r)]->data<float>()[i];
        v = op == graph::GroupReduce::sum ? v + x : std::max(v, x);
      }
      out[static_cast<size_t>(i)] = v;
    }
    s_.sync.arrive_and_wait();  // every rank has read every buffer
    std::memcpy(t.raw(), out.data(), out.size() * sizeof(float));
    ++calls;
  }
  int calls = 0;

 private:
  ThreadShared& s_;
  int rank_;
};

ModelOptions tiny(const char* arch) {
  ModelOptions o = preset_options(*find_arch(arch));
  o.layers = 2;
  o.hidden = 16;
  o.heads = 4;
  o.ffn = 32;
  o.dropout = 0.1;
  if (o.vocab_size) {
    o.vocab_size = 51;  // 26 + 25, 13 + 13 + 13 + 12
    o.seq_len = 8;
    o.max_positions = 12;
    o.mlm_predictions = 4;
  } else {
    o.image_size = 8;
    o.patch_size = 4;
    o.in_channels = 2;
    o.num_classes = 5;
  }
  return o;
}

void feed(graph::Executor& ex, const ModelGraph& g) {
  const graph::Value& in = g.graph.value(g.input);
  const graph::Value& lab = g.graph.value(g.labels);
  Tensor x = Tensor::empty(in.spec.shape, in.spec.dtype);
  Tensor y = Tensor::empty(lab.spec.shape, DType::i32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (in.spec.dtype == DType::i32) {
      x.data<int32_t>()[i] = static_cast<int32_t>((7 * i + 3) % 51);
    } else {
      x.data<float>()[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
    }
  }
  const int64_t classes = lab.spec.shape.rank() == 2 ? 51 : 5;
  for (int64_t i = 0; i < y.numel(); ++i) {
    y.data<int32_t>()[i] = static_cast<int32_t>((11 * i + 5) % classes);
    if (lab.spec.shape.rank() == 2 && i % 3 != 0) y.data<int32_t>()[i] = -100;
  }
  ex.set_input(g.input, x);
  ex.set_input(g.labels, y);
}

constexpr int64_t kBatch = 2;

struct Result {
  float loss = 0;
  std::vector<graph::FlatEntry> layout;  // the params store's (offsets into its buffer)
  std::vector<float> params, grads;
};

Result step(graph::Executor& ex, const ModelGraph& g) {
  ex.initialize(9);
  Result r;
  r.layout = ex.params().entries();
  const Tensor p = ex.params().flat(DType::f32);
  r.params.assign(p.data<float>(), p.data<float>() + p.numel());
  feed(ex, g);
  ex.forward(graph::Mode::train, 4, {0, kBatch});
  ex.backward(g.loss, 1.0f);
  r.loss = ex.value(g.loss).data<float>()[0];
  const Tensor gr = ex.grads().flat(DType::f32);
  r.grads.assign(gr.data<float>(), gr.data<float>() + gr.numel());
  return r;
}

void check_against_whole(const char* arch, int size) {
  CAPTURE(arch);
  CAPTURE(size);
  const ModelGraph whole_g = build_model(tiny(arch), kBatch);
  graph::Executor whole_ex(whole_g.graph);
  const Result whole = step(whole_ex, whole_g);
  float grad_scale = 0;
  for (float v : whole.grads) grad_scale = std::max(grad_scale, std::fabs(v));

  ThreadShared shared(size);
  std::vector<Result> ranks(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ModelGraph g = build_model(tiny(arch), kBatch);
      graph::split_tensor_parallel(g.graph, std::make_shared<ThreadGroup>(shared, r));
      graph::Executor ex(g.graph);
      ranks[static_cast<size_t>(r)] = step(ex, g);
    });
  }
  for (std::thread& t : threads) t.join();

  for (int r = 0; r < size; ++r) {
    const Result& mine = ranks[static_cast<size_t>(r)];
    CHECK(std::fabs(mine.loss - whole.loss) <= 1e-6f * std::fabs(whole.loss));
    REQUIRE(mine.layout.size() == whole.layout.size());
    for (size_t k = 0; k < mine.layout.size(); ++k) {
      const graph::FlatEntry& l = mine.layout[k];
      const graph::FlatEntry& w = whole.layout[k];
      CAPTURE(l.name);
      bool same_init = true;
      // A part keeps the whole's element order: whole_index rises with the local index
      // (a tensor-parallel resume finds a range's elements by bisection on it).
      bool rising = true;
      float diff = 0;
      for (int64_t j = 0; j < l.spec.shape.numel(); ++j) {
        const uint64_t whole_j = graph::whole_index(l.spec, j);
        rising = rising && (j == 0 || whole_j > graph::whole_index(l.spec, j - 1));
        const auto at = static_cast<size_t>(w.offset + static_cast<int64_t>(whole_j));
        const auto here = static_cast<size_t>(l.offset + j);
        same_init = same_init && mine.params[here] == whole.params[at];
        diff = std::max(diff, std::fabs(mine.grads[here] - whole.grads[at]));
      }
      CHECK(same_init);
      CHECK(rising);
      CHECK(diff <= 2e-6f * grad_scale);
      if (l.spec.split.split() || r == 0) continue;
      const Result& first = ranks[0];  // replicated: the same bits as rank 0's
      CHECK(std::memcmp(&mine.grads[static_cast<size_t>(l.offset)],
                        &first.grads[static_cast<size_t>(first.layout[k].offset)],
                        static_cast<size_t>(l.spec.shape.numel()) * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("tensor-parallel ranks compute the one-rank step: GPT-2, BERT and ViT, 2 and 4 ways") {
  for (const char* arch : {"gpt2-tiny", "bert-mini", "vit-tiny"}) {
    for (const int size : {2, 4}) check_against_whole(arch, size);
  }
}

TEST_CASE("the tensor-parallel plan: Megatron's pairs, heads and the vocabulary, what it refuses") {
  const ModelGraph gpt = build_model(tiny("gpt2-tiny"), kBatch);
  const graph::TensorParallelPlan plan = graph::plan_tensor_parallel(gpt.graph, 4, 3);
  const std::string text = graph::format_tensor_plan(gpt.graph, plan);
  CHECK(text.find("transformer  vocab  classes 39-50 of 51\n") != std::string::npos);
  CHECK(text.find("transformer.h.0.attn.c_attn  column  features 12-15 of 16 (x3)\n") !=
        std::string::npos);
  CHECK(text.find("transformer.h.0.attn  heads  heads 3-3 of 4\n") != std::string::npos);
  CHECK(text.find("transformer.h.0.attn.c_proj  row  features 12-15 of 16\n") != std::string::npos);
  CHECK(text.find("transformer.h.1.mlp.c_fc  column  features 24-31 of 32\n") != std::string::npos);
  CHECK(text.find("transformer.h.1.mlp.c_proj  row  features 24-31 of 32\n") != std::string::npos);
  CHECK(text.find("lm_head  vocab  classes 39-50 of 51\n") != std::string::npos);
  CHECK(text.find("loss  vocab  classes 39-50 of 51\n") != std::string::npos);
  CHECK(plan.splits.size() == 2 * 5 + 3);
  CHECK(plan.vocab_values == std::vector<graph::ValueId>{gpt.logits});
  CHECK(graph::share_of(51, 0, 4) == std::pair<int64_t, int64_t>{0, 13});
  CHECK(graph::share_of(51, 3, 4) == std::pair<int64_t, int64_t>{39, 12});

  // 3 ways do not divide 4 heads: the key is named.
  try {
    graph::plan_tensor_parallel(gpt.graph, 3, 0);
    FAIL("3 ways over 4 heads was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("model.heads") != std::string::npos);
  }
  // A CNN has nothing to split.
  ModelOptions cnn = preset_options(*find_arch("resnet18"));
  cnn.width = 0.25;
  cnn.image_size = 16;
  cnn.in_channels = 1;
  cnn.num_classes = 10;
  const ModelGraph resnet = build_model(cnn, kBatch);
  CHECK_THROWS_WITH_AS(graph::plan_tensor_parallel(resnet.graph, 2, 0),
                       doctest::Contains("no layer the tensor-parallel pass can split"), Error);
  // One rank: nothing split.
  CHECK(graph::plan_tensor_parallel(gpt.graph, 1, 0).splits.empty());
}
