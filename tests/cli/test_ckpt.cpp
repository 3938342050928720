// `dtrain ckpt inspect|verify|export` on checkpoints the real `dtrain train` wrote:
// what inspect prints, verify's exit 2 naming a damaged file, and for each family an
// export read back in C++ (PyTorch names and shapes) and loaded as model.init_from
// would, equal to the checkpoint's fp32 weights and buffers bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "runtime/export_names.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"

using namespace dtrain;
using namespace dtrain::train_test;

namespace {

struct Family {
  const char* arch;
  const char* yaml;
  const char* name;  // one exported tensor
  Shape shape;       // and its shape
};

const Family kFamilies[] = {
    {"resnet18",
     "model: {arch: resnet18, stem: small, width: 0.125, image_size: 16, in_channels: 3, "
     "num_classes: 10}\n"
     "data: {dataset: synthetic, global_batch: 8, workers: 1, limit: {test: 8}}\n"
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n",
     "layer2.0.downsample.1.running_var",
     {16}},
    {"gpt2-tiny",
     "model: {arch: gpt2-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 16, vocab_size: 256}\n"
     "data: {dataset: synthetic, global_batch: 4, limit: {test: 4}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n",
     "transformer.h.0.mlp.c_fc.weight",
     {32, 128}},
    {"bert-tiny",
     "model: {arch: bert-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 16, vocab_size: 256}\n"
     "data: {dataset: synthetic, global_batch: 4, limit: {test: 4}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n",
     "bert.encoder.layer.0.attention.self.value.weight",
     {32, 32}},
    {"vit-tiny",
     "model: {arch: vit-tiny, image_size: 16, patch_size: 4, num_classes: 10, layers: 1, "
     "hidden: 24, heads: 2}\n"
     "data: {dataset: synthetic, global_batch: 4, workers: 1, limit: {test: 4}}\n"
     "optimizer: {name: adamw, lr: 1.0e-3}\n",
     "conv_proj.weight",
     {24, 3, 4, 4}},
};

// Trains `f` for `steps` steps into dir/<arch>; returns the run directory.
fs::path train(const fs::path& dir, const Family& f, int steps, const std::string& extra = "") {
  const fs::path job = dir / (std::string(f.arch) + ".yaml");
  const fs::path out = dir / f.arch;
  std::ofstream(job) << "run: {seed: 3, output_dir: " << out.string() << "}\n"
                     << f.yaml << "train: {steps: " << steps << ", log_every: 1" << extra
                     << "}\nlogging: {console: false}\n";
  const RunResult r = run_dtrain({job.string()}, dir / (std::string(f.arch) + "-train.log"));
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return out;
}

RunResult ckpt(const fs::path& dir, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"ckpt"};
  all.insert(all.end(), args.begin(), args.end());
  static int n = 0;
  return run_dtrain_command(all, dir / ("ckpt-" + std::to_string(n++) + ".log"));
}

// `dtrain ckpt export` of a run of `f` to dir/<arch>.safetensors, which must succeed.
fs::path export_run(const fs::path& dir, const Family& f, const fs::path& run) {
  const fs::path out = dir / (std::string(f.arch) + ".safetensors");
  const RunResult r = ckpt(dir, {"export", run.string(), "--safetensors", out.string()});
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return out;
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

void flip_byte(const fs::path& file, size_t at) {
  std::string bytes = read_bytes(file);
  REQUIRE(at < bytes.size());
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  write_bytes(file, bytes);
}

}  // namespace

TEST_CASE("dtrain ckpt inspect and verify a single-file checkpoint, damage is exit 2") {
  TempDir tmp("ckpt-file");
  const fs::path run = train(tmp.path(), kFamilies[1], 2, ", checkpoint: {every: 1, keep: 3}");
  const fs::path ckpts = run / "checkpoints";
  const fs::path step1 = ckpts / "step-00000001.dtckpt", step2 = ckpts / "step-00000002.dtckpt";
  REQUIRE(fs::is_regular_file(step1));

  RunResult r = ckpt(tmp.path(), {"inspect", run.string()});  // a run directory lists
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK(has(r.log, step1.string()));
  CHECK(has(r.log, step2.string()));
  CHECK(has(r.log, "file"));

  r = ckpt(tmp.path(), {"inspect", step2.string()});
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  for (const char* line : {"step: 2\n", "arch: gpt2-tiny\n", "attention heads: ",
                           "optimizer: adamw, step 2\n", "data position: epoch 0, offset 8\n",
                           "transformer.h.0.attn.c_attn.weight", "[96, 32]", "optim.exp_avg_sq"})
    CHECK_MESSAGE(has(r.log, line), line, "\n", r.log);

  r = ckpt(tmp.path(), {"inspect", "--json", step2.string()});
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json j = nlohmann::json::parse(r.log.substr(r.log.find('{')));
  CHECK(j.at("step") == 2);
  CHECK(j.at("kind") == "file");
  int64_t total = 0;
  for (const nlohmann::json& e : j.at("params")) total += e.at("elements").get<int64_t>();
  CHECK(j.at("parameters") == total);
  CHECK(total > 0);

  r = ckpt(tmp.path(), {"verify", ckpts.string()});
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK(has(r.log, "ok: " + step1.string()));
  CHECK(has(r.log, "ok: " + step2.string()));

  flip_byte(step1, fs::file_size(step1) / 2);
  r = ckpt(tmp.path(), {"verify", step1.string()});
  CHECK_MESSAGE(r.rc == 2, r.describe());
  CHECK_MESSAGE(has(r.log, "error: " + step1.string()), r.log);
  r = ckpt(tmp.path(), {"verify", ckpts.string()});
  CHECK_MESSAGE(r.rc == 2, r.describe());
  CHECK(has(r.log, "damaged: " + step1.string()));
  CHECK(has(r.log, "ok: " + step2.string()));
  CHECK(has(r.log, "1 of 2 checkpoints are damaged"));

  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"verify", (tmp.path() / "nothing").string()},
        std::vector<std::string>{"inspect", tmp.path().string()},
        std::vector<std::string>{"export", step2.string()},
        std::vector<std::string>{"export", step2.string(), "--safetensors", "x", "--dtype", "i8"},
        std::vector<std::string>{}}) {
    r = ckpt(tmp.path(), bad);
    CHECK_MESSAGE(r.rc == 2, r.describe());
  }
  // The job file's dtype names work too: fp16 is f16.
  const fs::path half = tmp.path() / "half.safetensors";
  r = ckpt(tmp.path(),
           {"export", step2.string(), "--safetensors", half.string(), "--dtype", "fp16"});
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(has(r.log, " in f16, "), r.log);
  CHECK(runtime::read_safetensors(half).tensors.at(0).tensor.dtype() == DType::f16);
}

TEST_CASE("dtrain ckpt export: every family under PyTorch names, back into our layout exactly") {
  TempDir tmp("ckpt-export");
  for (const Family& f : kFamilies) {
    CAPTURE(f.arch);
    const fs::path run = train(tmp.path(), f, 1);
    const fs::path out = tmp.path() / (std::string(f.arch) + ".safetensors");
    const RunResult r = ckpt(tmp.path(), {"export", run.string(), "--safetensors", out.string()});
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    CHECK(has(r.log, "wrote " + out.string()));

    const runtime::SafetensorsFile st = runtime::read_safetensors(out);
    CHECK(st.metadata.at("arch") == f.arch);
    const Tensor* t = st.find(f.name);
    REQUIRE_MESSAGE(t != nullptr, f.name);
    CHECK(t->shape() == f.shape);

    const runtime::Checkpoint ck =
        runtime::read_checkpoint(run / "checkpoints" / "step-00000001.dtckpt");
    const auto params = runtime::layout_from_meta(ck.meta.at("params"));
    const auto buffers = runtime::layout_from_meta(ck.meta.at("buffers"));
    const runtime::InitWeights w = runtime::load_init_weights(out, f.arch, params, buffers);
    const Tensor& p = ck.get("params.f32");
    REQUIRE(w.params.nbytes() == p.nbytes());
    CHECK(std::memcmp(w.params.raw(), p.raw(), p.nbytes()) == 0);
    if (!buffers.empty()) {
      const Tensor& b = ck.get("buffers.f32");
      REQUIRE(w.buffers.nbytes() == b.nbytes());
      CHECK(std::memcmp(w.buffers.raw(), b.raw(), b.nbytes()) == 0);
    }
  }
}

// model.init_from, end to end: a run started from another run's export holds that run's
// weights (one step at lr 1e-30 leaves the parameters as they came in) for
// GPT-2 (transposed Conv1D weights) and ResNet (batch-norm statistics); another
// family's file, a missing file or a NaN weight is exit 2 naming the key and the tensor
// or file.
TEST_CASE("model.init_from starts a run from an exported file, mismatches are exit 2") {
  TempDir tmp("ckpt-init-from");
  for (const Family* f : {&kFamilies[0], &kFamilies[1]}) {
    CAPTURE(f->arch);
    const fs::path run = train(tmp.path(), *f, 2);
    const fs::path exported = export_run(tmp.path(), *f, run);
    const fs::path job = tmp.path() / (std::string(f->arch) + "-init.yaml");
    const fs::path out = tmp.path() / (std::string(f->arch) + "-init");
    std::ofstream(job) << "run: {seed: 11, output_dir: " << out.string() << "}\n"
                       << f->yaml << "train: {steps: 1, log_every: 1}\n"
                       << "logging: {console: false}\n";
    const RunResult r =
        run_dtrain({job.string(), "--set", "model.init_from=" + exported.string(), "--set",
                    "optimizer.lr=1.0e-30", "--set", "optimizer.weight_decay=0"},
                   tmp.path() / (std::string(f->arch) + "-init.log"));
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    CHECK_MESSAGE(has(r.log, "initialised from " + exported.string()), r.log);
    const runtime::Checkpoint a =
        runtime::read_any_checkpoint(newest_checkpoint(run / "checkpoints"));
    const runtime::Checkpoint b =
        runtime::read_any_checkpoint(newest_checkpoint(out / "checkpoints"));
    const Tensor& pa = a.get("params.f32");
    const Tensor& pb = b.get("params.f32");
    REQUIRE(pa.nbytes() == pb.nbytes());
    // lr 1e-30 moves a weight by about 1e-30, below the last bit of any weight above
    // 1e-22; a wrong name, shape or transposition moves it by the weights' own size.
    double worst = 0;
    for (int64_t i = 0; i < pa.numel(); ++i)
      worst = std::max(worst, std::fabs(double{pa.data<float>()[i]} - pb.data<float>()[i]));
    CHECK(worst < 1e-20);
  }
  // GPT-2's weights into a BERT job; a file that is not there.
  const fs::path gpt = tmp.path() / "gpt2-tiny.safetensors";
  const fs::path bert_job = tmp.path() / "bert.yaml";
  std::ofstream(bert_job) << "run: {output_dir: " << (tmp.path() / "bert").string() << "}\n"
                          << kFamilies[2].yaml << "train: {steps: 1}\nlogging: {console: false}\n";
  const RunResult wrong = run_dtrain(
      {bert_job.string(), "--set", "model.init_from=" + gpt.string()}, tmp.path() / "wrong.log");
  CHECK_MESSAGE(wrong.rc == 2, wrong.describe());
  CHECK_MESSAGE(has(wrong.log, "model.init_from: " + gpt.string()), wrong.log);
  CHECK_MESSAGE(has(wrong.log, "transformer."), wrong.log);
  const RunResult missing =
      run_dtrain({bert_job.string(), "--set", "model.init_from=/nonexistent.safetensors"},
                 tmp.path() / "missing.log");
  CHECK_MESSAGE(missing.rc == 2, missing.describe());
  CHECK_MESSAGE(has(missing.log, "model.init_from: /nonexistent.safetensors"), missing.log);
  // A run directory or a checkpoint file instead of an export: exit 2 saying to export it.
  const fs::path gpt_run = tmp.path() / "gpt2-tiny";
  const fs::path gpt_ckpt = newest_checkpoint(gpt_run / "checkpoints");
  for (const fs::path& p : {gpt_run, gpt_ckpt}) {
    const RunResult r = run_dtrain({bert_job.string(), "--set", "model.init_from=" + p.string()},
                                   tmp.path() / "not-export.log");
    CHECK_MESSAGE(r.rc == 2, r.describe());
    CHECK_MESSAGE(has(r.log, p == gpt_run ? "is a directory, not a safetensors file"
                                          : "is a dtrain checkpoint, not a safetensors file"),
                  r.log);
    CHECK_MESSAGE(has(r.log, "dtrain ckpt export " + p.string()), r.log);
  }
  // A NaN weight: refused naming the tensor, not trained on until the loss is NaN.
  runtime::SafetensorsFile st = runtime::read_safetensors(gpt);
  runtime::NamedTensor* fc = nullptr;
  for (runtime::NamedTensor& t : st.tensors)
    if (t.name == "transformer.h.0.mlp.c_fc.weight") fc = &t;
  REQUIRE(fc != nullptr);
  REQUIRE(fc->tensor.dtype() == DType::f32);
  fc->tensor.data<float>()[5] = std::nanf("");
  const fs::path nan_file = tmp.path() / "nan.safetensors";
  runtime::write_safetensors(nan_file, st.tensors, st.metadata);
  const fs::path gpt_job = tmp.path() / "gpt2-tiny-init.yaml";
  const RunResult nan =
      run_dtrain({gpt_job.string(), "--set", "model.init_from=" + nan_file.string(), "--set",
                  "run.output_dir=" + (tmp.path() / "nan").string()},
                 tmp.path() / "nan.log");
  CHECK_MESSAGE(nan.rc == 2, nan.describe());
  CHECK_MESSAGE(has(nan.log, "model.init_from: " + nan_file.string() +
                                 ": tensor transformer.h.0.mlp.c_fc.weight holds nan at element 5"),
                nan.log);
}

// Fine-tuning: an export of a 10-class ResNet and ViT into 4-class models. Their heads
// (fc.*, heads.head.*) have another shape: not used, and the model's own heads keep the
// seed's values (those of the same job without init_from), while every other weight
// is the export's. One step at lr 1e-30 leaves all of them as they came in.
TEST_CASE("model.init_from into another class count: the head starts from the seed") {
  TempDir tmp("ckpt-init-head");
  for (const Family* f : {&kFamilies[0], &kFamilies[3]}) {
    CAPTURE(f->arch);
    const fs::path run = train(tmp.path(), *f, 2);
    const fs::path exported = export_run(tmp.path(), *f, run);
    std::string yaml = f->yaml;
    const size_t at = yaml.find("num_classes: 10");
    REQUIRE(at != std::string::npos);
    yaml.replace(at, 15, "num_classes: 4");
    const auto fine_tune = [&](const std::string& tag, bool init) {
      const fs::path job = tmp.path() / (std::string(f->arch) + "-" + tag + ".yaml");
      const fs::path out = tmp.path() / (std::string(f->arch) + "-" + tag);
      std::ofstream(job) << "run: {seed: 11, output_dir: " << out.string() << "}\n"
                         << yaml << "train: {steps: 1, log_every: 1}\n"
                         << "logging: {console: false}\n";
      std::vector<std::string> args = {job.string(), "--set", "optimizer.lr=1.0e-30", "--set",
                                       "optimizer.weight_decay=0"};
      if (init) args.insert(args.end(), {"--set", "model.init_from=" + exported.string()});
      const RunResult r = run_dtrain(args, tmp.path() / (tag + ".log"));
      REQUIRE_MESSAGE(r.rc == 0, r.describe());
      if (init) {
        const std::string head =
            f == &kFamilies[0] ? "fc.weight, fc.bias" : "heads.head.weight, heads.head.bias";
        CHECK_MESSAGE(has(r.log,
                          "2 head tensor(s) start from the seed (not in the file, or shaped "
                          "differently there): " +
                              head),
                      r.log);
        CHECK_MESSAGE(has(r.log, "2 head tensor(s) of the file not used: " + head), r.log);
      }
      return runtime::read_any_checkpoint(newest_checkpoint(out / "checkpoints"));
    };
    const runtime::Checkpoint tuned = fine_tune("tuned", true);
    const runtime::Checkpoint seeded = fine_tune("seeded", false);
    const runtime::Checkpoint source =
        runtime::read_any_checkpoint(newest_checkpoint(run / "checkpoints"));
    const auto layout = runtime::layout_from_meta(tuned.meta.at("params"));
    const auto source_layout = runtime::layout_from_meta(source.meta.at("params"));
    const auto value = [](const runtime::Checkpoint& ck, const graph::FlatEntry& e, int64_t i) {
      return double{ck.get("params.f32").data<float>()[e.offset + i]};
    };
    int heads = 0;
    for (const graph::FlatEntry& e : layout) {
      CAPTURE(e.name);
      const bool head = e.name.rfind("fc.", 0) == 0 || e.name.rfind("heads.", 0) == 0;
      heads += head;
      const auto from = std::find_if(source_layout.begin(), source_layout.end(),
                                     [&](const graph::FlatEntry& s) { return s.name == e.name; });
      REQUIRE(from != source_layout.end());
      double worst = 0;
      for (int64_t i = 0; i < e.spec.shape.numel(); ++i) {
        const double want = head ? value(seeded, e, i) : value(source, *from, i);
        worst = std::max(worst, std::fabs(value(tuned, e, i) - want));
      }
      CHECK(worst < 1e-20);
    }
    CHECK(heads == 2);
  }
}
