// safetensors files and the PyTorch name mapping (runtime/safetensors.h,
// runtime/export_names.h): the container round trip and its damage checks; for each
// family a model built in-process with random weights, exported from a checkpoint and
// read back (names, shapes, values checked against hand-written expectations: GPT-2's
// Conv1D transposition, BERT's split query/key/value, ViT's conv_proj and class token),
// load_init_weights back to the flat layout bit for bit, and its refusals.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "graph/params.h"
#include "models/registry.h"
#include "runtime/export_names.h"
#include "runtime/safetensors.h"

using namespace dtrain;
using namespace dtrain::runtime;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("dtrain-test-st-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

nlohmann::json layout_meta(const std::vector<graph::FlatEntry>& entries) {
  nlohmann::json list = nlohmann::json::array();
  for (const graph::FlatEntry& e : entries) {
    list.push_back({e.name, std::string(dtype_name(e.spec.dtype)),
                    std::vector<int64_t>(e.spec.shape.begin(), e.spec.shape.end())});
  }
  return list;
}

// A model of `options` with random parameters and patterned buffers, as a checkpoint.
struct Model {
  graph::FlatStore params, buffers;
  Checkpoint ck;
};

Model make_model(const ModelOptions& options) {
  const models::ModelGraph g = models::build_model(options, 1);
  Model m{graph::FlatStore(g.graph.param_layout()), graph::FlatStore(g.graph.buffer_layout()), {}};
  m.params.allocate();
  m.params.initialize(11);
  m.buffers.allocate();
  const Tensor b = m.buffers.flat(DType::f32);
  for (int e = 0; e < m.buffers.size(); ++e) {  // the padding stays 0
    const Tensor v = m.buffers.view(e);
    for (int64_t i = 0; i < v.numel(); ++i)
      v.data<float>()[i] = 0.25f * static_cast<float>((i + e) % 97) + 1.0f;
  }
  m.ck.file = "in-memory.dtckpt";
  m.ck.meta = {{"format", "dtrain-train-state"},
               {"step", 7},
               {"arch", options.arch},
               {"params", layout_meta(m.params.entries())},
               {"buffers", layout_meta(m.buffers.entries())}};
  m.ck.tensors.push_back({"params.f32", m.params.flat(DType::f32)});
  if (b.defined()) m.ck.tensors.push_back({"buffers.f32", b});
  return m;
}

// Checks `st[name]` has `shape` and holds rows [row0, row0 + rows) of our tensor (seen
// as [R, cols]), transposed when asked.
void check_tensor(const SafetensorsFile& st, const std::string& name, const Shape& shape,
                  const Tensor& ours, int64_t row0, int64_t rows, bool transpose) {
  CAPTURE(name);
  const Tensor* t = st.find(name);
  REQUIRE(t != nullptr);
  CHECK(t->shape() == shape);
  REQUIRE(t->dtype() == DType::f32);
  const int64_t cols = ours.numel() / ours.dim(0);
  REQUIRE(t->numel() == rows * cols);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float want = ours.data<float>()[(row0 + r) * cols + c];
      const float got = t->data<float>()[transpose ? c * rows + r : r * cols + c];
      bad += std::memcmp(&want, &got, 4) != 0;
    }
  }
  CHECK(bad == 0);
}

void check_same(const SafetensorsFile& st, const std::string& name, const Tensor& ours) {
  check_tensor(st, name, ours.shape(), ours, 0, ours.dim(0), false);
}

// Export -> load_init_weights gives back the flat buffers bit for bit.
void check_round_trip(const Model& m, const fs::path& file, const std::string& arch) {
  const InitWeights w = load_init_weights(file, arch, m.params.entries(), m.buffers.entries());
  const Tensor p = m.params.flat(DType::f32);
  REQUIRE(w.params.numel() == p.numel());
  CHECK(std::memcmp(w.params.raw(), p.raw(), p.nbytes()) == 0);
  const Tensor b = m.buffers.flat(DType::f32);
  CHECK(w.buffers.defined() == b.defined());
  if (b.defined()) {
    REQUIRE(w.buffers.numel() == b.numel());
    CHECK(std::memcmp(w.buffers.raw(), b.raw(), b.nbytes()) == 0);
  }
}

int64_t model_elements(const Model& m) { return m.params.numel() + m.buffers.numel(); }

ModelOptions options_for(const std::string& arch) {
  ModelOptions o;
  o.arch = arch;
  if (arch == "resnet18") {
    o.stem = ResNetStem::small;
    o.width = 0.125;
    o.image_size = 32;
    o.num_classes = 10;
  } else if (arch == "vit-tiny") {
    o.image_size = 16;
    o.patch_size = 4;
    o.num_classes = 10;
    o.layers = 2;
    o.hidden = 24;
    o.heads = 2;
  } else {
    o.layers = 2;
    o.hidden = 32;
    o.heads = 2;
    o.seq_len = 16;
    o.max_positions = 16;
    o.vocab_size = 100;
  }
  return o;
}

}  // namespace

TEST_CASE("safetensors round trip: dtypes, shapes, bits, metadata, aligned header") {
  const fs::path dir = fresh_dir("roundtrip");
  Tensor a = Tensor::empty({2, 3}, DType::f32);
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = -1.5f * static_cast<float>(i);
  Tensor h = Tensor::empty({5}, DType::bf16);
  for (int i = 0; i < 5; ++i) h.data<bf16>()[i] = to_bf16(static_cast<float>(i) / 3.0f);
  Tensor n = Tensor::empty({}, DType::i64);
  n.data<int64_t>()[0] = 42;
  write_safetensors(dir / "x.safetensors", {{"b.weight", a}, {"a.half", h}, {"count", n}},
                    {{"format", "pt"}});
  const std::string bytes = read_file(dir / "x.safetensors");
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  CHECK(len % 8 == 0);
  CHECK(bytes.size() == 8 + len + 24 + 10 + 8);
  const SafetensorsFile st = read_safetensors(dir / "x.safetensors");
  REQUIRE(st.tensors.size() == 3);
  CHECK(st.tensors[0].name == "b.weight");  // in the order of their data
  CHECK(st.tensors[1].name == "a.half");
  CHECK(st.metadata.at("format") == "pt");
  CHECK(st.find("b.weight")->shape() == Shape{2, 3});
  CHECK(std::memcmp(st.find("b.weight")->raw(), a.raw(), a.nbytes()) == 0);
  CHECK(std::memcmp(st.find("a.half")->raw(), h.raw(), h.nbytes()) == 0);
  CHECK(st.find("count")->rank() == 0);
  CHECK(st.find("count")->data<int64_t>()[0] == 42);
  fs::remove_all(dir);
}

TEST_CASE("damaged safetensors files are refused naming the file and what is wrong") {
  const fs::path dir = fresh_dir("damage");
  Tensor a = Tensor::empty({4}, DType::f32);
  for (int i = 0; i < 4; ++i) a.data<float>()[i] = static_cast<float>(i);
  const fs::path good = dir / "good.safetensors";
  write_safetensors(good, {{"w", a}, {"v", a}}, {});
  const std::string bytes = read_file(good);
  const fs::path bad = dir / "bad.safetensors";
  auto err = [&](const std::string& content) {
    write_file(bad, content);
    return error_of([&] { read_safetensors(bad); });
  };
  CHECK(err(bytes.substr(0, bytes.size() - 1)).find("the tensors hold 32 data bytes") !=
        std::string::npos);
  CHECK(err(bytes.substr(0, 5)).find("too short") != std::string::npos);
  std::string huge = bytes;
  huge[6] = 1;  // a header length of 2^48
  CHECK(err(huge).find("the header claims") != std::string::npos);
  std::string garbled = bytes;
  garbled[8] = '[';
  CHECK(err(garbled).find(bad.string()) == 0);
  std::string dtype = bytes;
  dtype.replace(dtype.find("\"F32\""), 5, "\"I16\"");
  CHECK(err(dtype).find("has dtype I16") != std::string::npos);
  std::string gap = bytes;
  gap.replace(gap.find("[16,32]"), 7, "[17,33]");
  CHECK(err(gap).find("a gap or an overlap") != std::string::npos);
  CHECK(error_of([&] { read_safetensors(dir / "missing.safetensors"); }).find("cannot read") !=
        std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("GPT-2 exports as GPT2LMHeadModel: wte, wpe, Conv1D weights transposed") {
  const fs::path dir = fresh_dir("gpt2");
  const Model m = make_model(options_for("gpt2-tiny"));
  const fs::path file = dir / "gpt2.safetensors";
  const ExportSummary s = export_safetensors(m.ck, file, DType::f32);
  CHECK(s.arch == "gpt2-tiny");
  CHECK(s.elements == model_elements(m));
  const SafetensorsFile st = read_safetensors(file);
  CHECK(st.metadata.at("format") == "pt");
  CHECK(st.tensors.size() == 4 + 2 * 12);
  check_same(st, "transformer.wte.weight", m.params.view("transformer.word_embeddings.weight"));
  check_same(st, "transformer.wpe.weight", m.params.view("transformer.position_embeddings.weight"));
  for (const char* w : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
    for (int layer : {0, 1}) {
      const std::string name = fmt::format("transformer.h.{}.{}.weight", layer, w);
      const Tensor ours = m.params.view(name);
      check_tensor(st, name, {ours.dim(1), ours.dim(0)}, ours, 0, ours.dim(0), true);
      check_same(st, fmt::format("transformer.h.{}.{}.bias", layer, w),
                 m.params.view(fmt::format("transformer.h.{}.{}.bias", layer, w)));
    }
  }
  CHECK(st.find("transformer.h.0.attn.c_attn.weight")->shape() == Shape{32, 96});
  check_same(st, "transformer.h.1.ln_2.weight", m.params.view("transformer.h.1.ln_2.weight"));
  check_same(st, "transformer.ln_f.bias", m.params.view("transformer.ln_f.bias"));
  CHECK(st.find("lm_head.weight") == nullptr);  // tied to wte
  check_round_trip(m, file, "gpt2-tiny");
  fs::remove_all(dir);
}

TEST_CASE("BERT exports as BertForMaskedLM: query, key and value split from the fused qkv") {
  const fs::path dir = fresh_dir("bert");
  const Model m = make_model(options_for("bert-tiny"));
  const fs::path file = dir / "bert.safetensors";
  const ExportSummary s = export_safetensors(m.ck, file, DType::f32);
  CHECK(s.elements == model_elements(m));
  const SafetensorsFile st = read_safetensors(file);
  for (const char* t : {"word", "position", "token_type"}) {
    check_same(st, fmt::format("bert.embeddings.{}_embeddings.weight", t),
               m.params.view(fmt::format("embeddings.{}_embeddings.weight", t)));
  }
  check_same(st, "bert.embeddings.LayerNorm.weight", m.params.view("embeddings.LayerNorm.weight"));
  for (int layer : {0, 1}) {
    const std::string p = fmt::format("encoder.layer.{}.", layer);
    const Tensor w = m.params.view(p + "attention.self.qkv.weight");  // [3C, C]
    const Tensor b = m.params.view(p + "attention.self.qkv.bias");
    const char* parts[] = {"query", "key", "value"};
    for (int i = 0; i < 3; ++i) {
      const std::string q = "bert." + p + "attention.self." + parts[i];
      check_tensor(st, q + ".weight", {32, 32}, w, 32 * i, 32, false);
      check_tensor(st, q + ".bias", {32}, b, 32 * i, 32, false);
    }
    for (const char* n :
         {"attention.output.dense.weight", "attention.output.LayerNorm.bias",
          "intermediate.dense.weight", "output.dense.bias", "output.LayerNorm.weight"})
      check_same(st, "bert." + p + n, m.params.view(p + n));
    CHECK(st.find("bert." + p + "attention.self.qkv.weight") == nullptr);
  }
  check_same(st, "cls.predictions.transform.dense.weight",
             m.params.view("cls.predictions.transform.dense.weight"));
  check_same(st, "cls.predictions.transform.LayerNorm.bias",
             m.params.view("cls.predictions.transform.LayerNorm.bias"));
  check_same(st, "cls.predictions.bias", m.params.view("cls.predictions.decoder.bias"));
  CHECK(st.find("cls.predictions.decoder.weight") == nullptr);  // tied to the word table
  check_round_trip(m, file, "bert-tiny");
  fs::remove_all(dir);
}

TEST_CASE("ViT exports as torchvision: conv_proj [hidden, C, P, P], class token, in_proj") {
  const fs::path dir = fresh_dir("vit");
  const Model m = make_model(options_for("vit-tiny"));
  const fs::path file = dir / "vit.safetensors";
  const ExportSummary s = export_safetensors(m.ck, file, DType::f32);
  CHECK(s.elements == model_elements(m));
  const SafetensorsFile st = read_safetensors(file);
  const Tensor proj = m.params.view("conv_proj.weight");  // [24, 3*4*4]
  check_tensor(st, "conv_proj.weight", {24, 3, 4, 4}, proj, 0, 24, false);
  check_same(st, "conv_proj.bias", m.params.view("conv_proj.bias"));
  check_tensor(st, "class_token", {1, 1, 24}, m.params.view("encoder.embed.class_token"), 0, 24,
               false);
  check_tensor(st, "encoder.pos_embedding", {1, 17, 24},
               m.params.view("encoder.embed.position_embeddings"), 0, 17, false);
  const std::string p = "encoder.layers.encoder_layer_1.";
  check_same(st, p + "self_attention.in_proj_weight",
             m.params.view(p + "self_attention.in_proj.weight"));
  check_same(st, p + "self_attention.in_proj_bias",
             m.params.view(p + "self_attention.in_proj.bias"));
  for (const char* n :
       {"ln_1.weight", "self_attention.out_proj.weight", "ln_2.bias", "mlp.0.weight", "mlp.3.bias"})
    check_same(st, p + n, m.params.view(p + n));
  check_same(st, "encoder.ln.weight", m.params.view("encoder.ln.weight"));
  check_same(st, "heads.head.weight", m.params.view("heads.head.weight"));
  check_round_trip(m, file, "vit-tiny");
  fs::remove_all(dir);
}

TEST_CASE("ResNet exports under torchvision's names with the running statistics") {
  const fs::path dir = fresh_dir("resnet");
  const Model m = make_model(options_for("resnet18"));
  const fs::path file = dir / "resnet.safetensors";
  const ExportSummary s = export_safetensors(m.ck, file, DType::f32);
  CHECK(s.elements == model_elements(m));
  const SafetensorsFile st = read_safetensors(file);
  CHECK(st.tensors.size() == m.params.entries().size() + m.buffers.entries().size());
  for (const char* n :
       {"conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.bias", "layer4.1.bn2.weight", "fc.weight", "fc.bias"})
    check_same(st, n, m.params.view(n));
  for (const char* n : {"bn1.running_mean", "layer3.0.downsample.1.running_var"})
    check_same(st, n, m.buffers.view(n));
  CHECK(st.find("bn1.num_batches_tracked") == nullptr);
  check_round_trip(m, file, "resnet18");
  // A torchvision state dict also holds num_batches_tracked (I64): skipped on import.
  std::vector<NamedTensor> with_count = read_safetensors(file).tensors;
  Tensor count = Tensor::empty({}, DType::i64);
  count.data<int64_t>()[0] = 5;
  with_count.push_back({"bn1.num_batches_tracked", count});
  write_safetensors(dir / "torchvision.safetensors", with_count, {});
  check_round_trip(m, dir / "torchvision.safetensors", "resnet18");
  fs::remove_all(dir);
}

TEST_CASE("a bf16 export loads back as the bf16-rounded weights") {
  const fs::path dir = fresh_dir("bf16");
  const Model m = make_model(options_for("gpt2-tiny"));
  export_safetensors(m.ck, dir / "half.safetensors", DType::bf16);
  const SafetensorsFile st = read_safetensors(dir / "half.safetensors");
  CHECK(st.find("transformer.wte.weight")->dtype() == DType::bf16);
  const InitWeights w = load_init_weights(dir / "half.safetensors", "gpt2-tiny", m.params.entries(),
                                          m.buffers.entries());
  const Tensor p = m.params.flat(DType::f32);
  int64_t bad = 0;
  for (int64_t i = 0; i < p.numel(); ++i)
    bad += w.params.data<float>()[i] != to_f32(to_bf16(p.data<float>()[i]));
  CHECK(bad == 0);
  fs::remove_all(dir);
}

TEST_CASE("load_init_weights refuses a renamed, missing, extra or reshaped tensor by name") {
  const fs::path dir = fresh_dir("refuse");
  const Model m = make_model(options_for("gpt2-tiny"));
  const fs::path file = dir / "gpt2.safetensors";
  export_safetensors(m.ck, file, DType::f32);
  const std::vector<NamedTensor> good = read_safetensors(file).tensors;
  const fs::path bad = dir / "bad.safetensors";
  auto load_error = [&](std::vector<NamedTensor> tensors) {
    write_safetensors(bad, tensors, {});
    return error_of(
        [&] { load_init_weights(bad, "gpt2-tiny", m.params.entries(), m.buffers.entries()); });
  };
  {
    std::vector<NamedTensor> t = good;
    for (NamedTensor& x : t)
      if (x.name == "transformer.h.1.mlp.c_fc.bias") x.name = "transformer.h.1.mlp.fc.bias";
    const std::string e = load_error(t);
    CHECK(e.find(bad.string() + ": tensor transformer.h.1.mlp.fc.bias is not part of this "
                                "model") == 0);
  }
  {
    std::vector<NamedTensor> t = good;
    for (NamedTensor& x : t)
      if (x.name == "transformer.h.0.attn.c_attn.weight") x.tensor = x.tensor.reshape({96, 32});
    CHECK(load_error(t) == bad.string() +
                               ": tensor transformer.h.0.attn.c_attn.weight has shape [96, 32], "
                               "this model needs [32, 96]");
  }
  {
    std::vector<NamedTensor> t = good;
    t.erase(t.begin() + 3);
    const std::string e = load_error(t);
    CHECK(e.find(": no tensor " + good[3].name + " ") != std::string::npos);
    CHECK(e.find("which this model needs") != std::string::npos);
  }
  {
    std::vector<NamedTensor> t = good;
    t.push_back({"transformer.h.9.ln_1.weight", good[2].tensor});
    CHECK(load_error(t).find("tensor transformer.h.9.ln_1.weight is not part of this model") !=
          std::string::npos);
  }
  {  // Hugging Face's GPT2Model names (no "transformer.") and its attention-mask buffer
    std::vector<NamedTensor> t = good;
    for (NamedTensor& x : t) x.name = x.name.substr(std::string("transformer.").size());
    Tensor mask = Tensor::empty({1, 1, 4, 4}, DType::f32);
    std::memset(mask.raw(), 0, mask.nbytes());
    t.push_back({"h.0.attn.bias", mask});
    CHECK(load_error(t) == "");
  }
  {  // another model's weights (a BERT file for GPT-2)
    const Model bert = make_model(options_for("bert-tiny"));
    export_safetensors(bert.ck, dir / "bert.safetensors", DType::f32);
    const std::string e = error_of([&] {
      load_init_weights(dir / "bert.safetensors", "gpt2-tiny", m.params.entries(),
                        m.buffers.entries());
    });
    CHECK(e.find("tensor bert.embeddings.word_embeddings.weight is not part of this model") !=
          std::string::npos);
  }
  {  // a short file
    const std::string bytes = read_file(file);
    write_file(bad, bytes.substr(0, bytes.size() / 2));
    const std::string e = error_of(
        [&] { load_init_weights(bad, "gpt2-tiny", m.params.entries(), m.buffers.entries()); });
    CHECK(e.find(bad.string() + ":") == 0);
  }
  CHECK(error_of([&] {
          load_init_weights(file, "gpt3", m.params.entries(), m.buffers.entries());
        }).find("unknown architecture \"gpt3\"") != std::string::npos);
  fs::remove_all(dir);
}
