// optimizer.freeze and optimizer.layer_decay end to end, on the tiny ResNet-18 of the
// trainer's tests (8 blocks: the stem is layer 0, block b layer b + 1, the head layer 9):
// a fine-tune started from a run's export (model.init_from) with the stem and the first
// three stages frozen ends with those tensors bit for bit as exported while the rest
// trains, batch-norm statistics included; layer decay scales each layer's first update
// by decay^(9 - layer) and leaves the head's alone; bad patterns exit 2 naming the key.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"
#include "runtime/checkpoint.h"
#include "runtime/param_groups.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"

using namespace dtrain::train_test;
namespace runtime = dtrain::runtime;
using dtrain::Tensor;

namespace {

// The model tensors (parameters and buffers, f32, by name) of a run's newest checkpoint.
std::map<std::string, Tensor> model_tensors(const fs::path& run) {
  const runtime::Checkpoint ck = runtime::read_checkpoint(newest_checkpoint(run / "checkpoints"));
  std::map<std::string, Tensor> out;
  for (runtime::NamedTensor& t : runtime::checkpoint_model_tensors(ck))
    out.emplace(t.name, std::move(t.tensor));
  return out;
}

// One optimizer buffer of a run's newest checkpoint ("exp_avg"), by parameter name.
std::map<std::string, Tensor> state_tensors(const fs::path& run, const std::string& buffer) {
  runtime::Checkpoint ck = runtime::read_checkpoint(newest_checkpoint(run / "checkpoints"));
  const Tensor state = ck.get("optim." + buffer);
  for (runtime::NamedTensor& t : ck.tensors)
    if (t.name == "params.f32") t.tensor = state;  // the same layout
  std::map<std::string, Tensor> out;
  for (runtime::NamedTensor& t : runtime::checkpoint_model_tensors(ck))
    out.emplace(t.name, std::move(t.tensor));
  return out;
}

std::map<std::string, Tensor> safetensors_of(const fs::path& file) {
  std::map<std::string, Tensor> out;
  for (runtime::NamedTensor& t : runtime::read_safetensors(file).tensors)
    out.emplace(t.name, std::move(t.tensor));
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool all_zero(const Tensor& t) {
  const float* v = t.data<float>();
  return std::all_of(v, v + t.numel(), [](float x) { return x == 0.0f; });
}

// sum |a - b| over a tensor.
double distance(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    s += std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]);
  return s;
}

// The trainer's tests' job trained `steps` steps at <dir>/base, exported to
// <dir>/base.safetensors: the weights a fine-tune starts from.
fs::path base_export(const fs::path& dir, int steps) {
  const fs::path job = write_job(dir, "base");
  RunResult r =
      run_dtrain({job.string(), "--set", "train.steps=" + std::to_string(steps)}, dir / "base.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path exported = dir / "base.safetensors";
  r = run_dtrain_command(
      {"ckpt", "export", (dir / "base").string(), "--safetensors", exported.string()},
      dir / "export.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  return exported;
}

}  // namespace

TEST_CASE("freeze: patterns match a name or a module, * any characters") {
  CHECK(runtime::pattern_matches("layer1", "layer1.0.conv1.weight"));
  CHECK(runtime::pattern_matches("layer1.0", "layer1.0.conv1.weight"));
  CHECK_FALSE(runtime::pattern_matches("layer1.0", "layer1.01.conv1.weight"));
  CHECK_FALSE(runtime::pattern_matches("layer", "layer1.0.conv1.weight"));
  CHECK(runtime::pattern_matches("layer1.0.conv1.weight", "layer1.0.conv1.weight"));
  CHECK(runtime::pattern_matches("*.bn?", "layer1.0.bn2.bias"));
  CHECK(runtime::pattern_matches("*embed*", "embeddings.word_embeddings.weight"));
  CHECK(runtime::pattern_matches("encoder.layer.*.attention", "encoder.layer.3.attention.q.w"));
  CHECK_FALSE(runtime::pattern_matches("encoder.layer.1", "encoder.layer.10.output.dense.bias"));
  CHECK_FALSE(runtime::pattern_matches("*.bias", "fc.weight"));
}

TEST_CASE("freeze: a fine-tune from an export keeps the frozen tensors bit for bit") {
  TempDir tmp("freeze");
  const fs::path exported = base_export(tmp.path(), 8);

  const fs::path tuned = write_job(tmp.path(), "tuned");
  RunResult r =
      run_dtrain({tuned.string(), "--set", "model.init_from=" + exported.string(), "--set",
                  "optimizer.freeze=[conv1, bn1, layer1, layer2, \"layer3.*\"]", "--set",
                  "optimizer.weight_decay=0.05", "--set", "logging.console=true"},
                 tmp.path() / "tuned.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(contains(r.log, "optimizer.freeze: 45 of 62 tensors frozen"), r.log);

  const auto start = safetensors_of(exported);
  const auto end = model_tensors(tmp.path() / "tuned");
  int frozen = 0, trained = 0;
  for (const auto& [name, t] : end) {
    CAPTURE(name);
    REQUIRE(start.count(name) == 1);
    const bool buffer =
        name.find("running_") != std::string::npos || name.find("num_batches") != std::string::npos;
    const bool in_frozen = name.rfind("layer4", 0) != 0 && name.rfind("fc", 0) != 0;
    if (buffer) {  // batch-norm statistics update in training mode, frozen or not
      if (name.find("running_mean") != std::string::npos)
        CHECK_FALSE(same_bytes(t, start.at(name)));
    } else if (in_frozen) {
      CHECK(same_bytes(t, start.at(name)));
      ++frozen;
    } else {
      CHECK_FALSE(same_bytes(t, start.at(name)));
      ++trained;
    }
  }
  CHECK(frozen == 45);
  CHECK(trained == 17);
  // dtrain ckpt inspect lists the export's tensors (the names patterns may use) and says
  // what the checkpoint kept frozen.
  r = run_dtrain_command({"ckpt", "inspect", exported.string()}, tmp.path() / "inspect.log");
  CHECK_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(contains(r.log, "tensors: 102 tensors"), r.log);
  CHECK_MESSAGE(contains(r.log, "  layer4.1.bn2.running_var"), r.log);
  r = run_dtrain_command(
      {"ckpt", "inspect",
       (tmp.path() / "tuned" / "checkpoints").string() + "/step-00000008.dtckpt"},
      tmp.path() / "inspect.log");
  CHECK_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(
      contains(r.log,
               "steps frozen (optimizer.freeze, up to this step): 45 tensor(s) for 8 step(s)"),
      r.log);

  // A head the file does not hold (another class count), frozen: a warning.
  r = run_dtrain({tuned.string(), "--set", "model.init_from=" + exported.string(), "--set",
                  "model.num_classes=12", "--set", "optimizer.freeze=[fc, conv1]", "--set",
                  "train.steps=1", "--set", "run.output_dir=" + (tmp.path() / "seeded").string(),
                  "--set", "logging.console=true"},
                 tmp.path() / "seeded.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(contains(r.log,
                         "warning: optimizer.freeze keeps 2 tensor(s) the file does not "
                         "hold at their seeded values for the whole run: fc.weight, fc.bias"),
                r.log);

  // dtrain validate says the same, and refuses what train refuses.
  r = run_dtrain_command({"validate", tuned.string(), "--no-data", "--set",
                          "optimizer.freeze=[conv1, bn1, layer1, layer2, \"layer3.*\"]"},
                         tmp.path() / "validate.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(contains(r.log, "# optimizer.freeze: 45 of 62 tensors frozen"), r.log);
  for (const auto& [value, message] : std::vector<std::pair<std::string, std::string>>{
           {"[layer1, layer5]", "optimizer.freeze[1]: \"layer5\" matches no parameter of resnet18"},
           {"[\"*\"]", "optimizer.freeze: the patterns cover every parameter of resnet18"},
           {"layer1", "optimizer.freeze: expected a list of parameter name patterns"},
           {"[\"\"]", "optimizer.freeze[0]: expected a non-empty string"},
           {"[layer1, fc, layer1]",
            "optimizer.freeze[2]: \"layer1\" repeats optimizer.freeze[0]"}}) {
    for (const std::string command : {"train", "validate"}) {
      CAPTURE(command);
      const std::vector<std::string> args = {command, tuned.string(), "--set",
                                             "optimizer.freeze=" + value};
      r = run_dtrain_command(args, tmp.path() / "refused.log");
      CHECK_MESSAGE(r.rc == 2, r.describe());
      CHECK_MESSAGE(contains(r.log, message), r.log);
    }
  }
}

TEST_CASE("layer_decay: each layer's first update scaled by decay^(9 - layer), the head's alone") {
  TempDir tmp("layer_decay");
  const fs::path exported = base_export(tmp.path(), 2);
  RunResult r;
  const auto start = safetensors_of(exported);
  // One SGD step from the same weights on the same batch: the same gradient, so each
  // tensor's step differs by its factor alone (momentum's buffer is the gradient then).
  std::map<std::string, std::map<std::string, Tensor>> after;
  for (const char* decay : {"null", "0.9"}) {
    const fs::path job = write_job(tmp.path(), std::string("decay-") + decay);
    r = run_dtrain(
        {job.string(), "--set", "model.init_from=" + exported.string(), "--set", "train.steps=1",
         "--set", std::string("optimizer.layer_decay=") + decay, "--set", "logging.console=true"},
        tmp.path() / (std::string("decay-") + decay + ".log"));
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    if (std::string(decay) != "null")
      CHECK_MESSAGE(contains(r.log, "optimizer.layer_decay: 0.9 over 10 layers"), r.log);
    after[decay] = model_tensors(tmp.path() / (std::string("decay-") + decay));
  }
  const std::vector<std::pair<std::string, int>> layers = {
      {"conv1.weight", 0},          {"layer1.0.conv1.weight", 1}, {"layer2.1.conv2.weight", 4},
      {"layer4.0.conv1.weight", 7}, {"layer4.1.bn2.weight", 8},   {"fc.weight", 9}};
  for (const auto& [name, layer] : layers) {
    CAPTURE(name);
    const double plain = distance(after["null"].at(name), start.at(name));
    const double decayed = distance(after["0.9"].at(name), start.at(name));
    REQUIRE(plain > 0);
    CHECK(decayed / plain == doctest::Approx(std::pow(0.9, 9 - layer)).epsilon(0.01));
  }
  CHECK(same_bytes(after["null"].at("fc.weight"), after["0.9"].at("fc.weight")));
}

// optimizer.groups, PyTorch's parameter groups: the first group whose patterns match a
// parameter decides its learning-rate factor and weight decay. One SGD step from the
// same weights on the same batch, so each tensor's step differs by its group's settings
// alone: layer4 (group 1) steps 4x the plain run's; fc (group 0, which also wins fc over
// group 1's pattern) takes no weight decay, the same bits as a run with weight_decay 0;
// the rest is the plain run's, bit for bit.
TEST_CASE("groups: the first matching group sets a tensor's lr factor and weight decay") {
  TempDir tmp("groups");
  const fs::path exported = base_export(tmp.path(), 2);
  const auto start = safetensors_of(exported);
  const std::string groups =
      "optimizer.groups=[{params: [fc], weight_decay: 0}, {params: [layer4, fc], lr_scale: 4}]";
  std::map<std::string, std::map<std::string, Tensor>> after;
  for (const auto& [name, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"plain", {"--set", "optimizer.weight_decay=0.05"}},
           {"groups", {"--set", "optimizer.weight_decay=0.05", "--set", groups}},
           {"no-decay", {"--set", "optimizer.weight_decay=0"}}}) {
    const fs::path job = write_job(tmp.path(), name);
    std::vector<std::string> args = {job.string(),
                                     "--set",
                                     "model.init_from=" + exported.string(),
                                     "--set",
                                     "train.steps=1",
                                     "--set",
                                     "logging.console=true"};
    args.insert(args.end(), sets.begin(), sets.end());
    const RunResult r = run_dtrain(args, tmp.path() / (name + ".log"));
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    if (name == "groups") {
      CHECK_MESSAGE(contains(r.log,
                             "optimizer.groups[0]: 2 tensors (650 parameters): fc (2); "
                             "weight decay 0"),
                    r.log);
      CHECK_MESSAGE(contains(r.log, "optimizer.groups[1]: "), r.log);
      CHECK_MESSAGE(
          contains(r.log,
                   "15 tensors (131712 parameters): layer4 (15), fc (2), 2 more in earlier "
                   "groups; learning rate x 4"),
          r.log);
    }
    after[name] = model_tensors(tmp.path() / name);
  }
  for (const char* name : {"layer4.0.conv1.weight", "layer4.1.bn2.weight"}) {
    CAPTURE(name);
    const double plain = distance(after["plain"].at(name), start.at(name));
    REQUIRE(plain > 0);
    CHECK(distance(after["groups"].at(name), start.at(name)) / plain ==
          doctest::Approx(4.0).epsilon(0.01));
  }
  for (const char* name : {"conv1.weight", "layer1.0.conv1.weight", "layer3.1.bn1.bias"}) {
    CAPTURE(name);
    CHECK(same_bytes(after["groups"].at(name), after["plain"].at(name)));
  }
  CHECK(same_bytes(after["groups"].at("fc.weight"), after["no-decay"].at("fc.weight")));
  CHECK_FALSE(same_bytes(after["groups"].at("fc.weight"), after["plain"].at("fc.weight")));
  // What a group cannot be: exit 2 naming the key, in validate and train alike.
  const fs::path job = write_job(tmp.path(), "bad");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"optimizer.groups=[{params: [layer9], lr_scale: 2}]",
       "optimizer.groups[0].params[0]: \"layer9\" matches no parameter of resnet18"},
      {"optimizer.groups=[{params: [fc, \"*.bias\", fc], lr_scale: 2}]",
       "optimizer.groups[0].params[2]: \"fc\" repeats optimizer.groups[0].params[0]"},
      {"optimizer.groups=[{params: [fc], lr_scale: 2}, {params: [\"fc.*\"], weight_decay: 0}]",
       "optimizer.groups[1]: every parameter its patterns match (2) belongs to an earlier group"},
      {"optimizer.groups=[{params: [fc], lr_scael: 2}]",
       "optimizer.groups[0].lr_scael: unknown key (did you mean \"lr_scale\"?)"},
      {"optimizer.groups=[{params: [fc]}]", "optimizer.groups[0]: the group sets nothing"},
      {"optimizer.groups=[{params: [fc], weight_decay: -1}]", "optimizer.groups[0].weight_decay"},
      {"optimizer.groups=[{params: [], lr_scale: 2}]", "optimizer.groups[0].params"},
      {"optimizer.groups=[{lr_scale: 2}]", "optimizer.groups[0].params: missing"},
      {"optimizer.groups=[{params: [fc], lr_scale: 1e300}]",
       "optimizer.groups[0].lr_scale: 1e+300 x optimizer.lr 0.05 is beyond what an f32"},
      {"optimizer.groups=[{params: [fc], lr_scale: 1e-50}]",
       "optimizer.groups[0].lr_scale: 1e-50 x optimizer.lr 0.05 rounds to a learning rate of 0"},
  };
  // A group deciding frozen tensors only changes nothing: a warning.
  const RunResult frozen =
      run_dtrain_command({"validate", job.string(), "--set", "optimizer.freeze=[fc]", "--set",
                          "optimizer.groups=[{params: [fc], lr_scale: 2}]"},
                         tmp.path() / "frozen.log");
  CHECK_MESSAGE(frozen.rc == 0, frozen.describe());
  CHECK_MESSAGE(contains(frozen.log,
                         "# optimizer.groups[0]: 2 tensors (650 parameters; 2 of the "
                         "tensors frozen): fc (2); learning rate x 2"),
                frozen.log);
  CHECK_MESSAGE(contains(frozen.log,
                         "# warning: optimizer.groups[0]: every tensor it decides is "
                         "frozen"),
                frozen.log);
  for (const auto& [set, message] : bad) {
    CAPTURE(set);
    for (const char* command : {"validate", "train"}) {
      const RunResult r =
          run_dtrain_command({command, job.string(), "--set", set}, tmp.path() / "bad.log");
      CHECK(r.rc == 2);
      CHECK_MESSAGE(contains(r.log, message), r.log);
    }
  }
}

// Training everything, then the head alone, then everything: a frozen tensor holds no
// optimizer state (the resume that froze it dropped its moments, and the checkpoint
// keeps zeros and how many steps it went without), so AdamW's bias correction of a
// tensor unfrozen at the next resume counts its own steps from there, as PyTorch's
// per-parameter step does for a parameter it starts to train: its first update is
// about lr per element (sign(g) lr), not (1 - b1) / sqrt(1 - b2) times a later step's
// share, nor a step of moments two steps stale. (A block's convolutions get little
// gradient: its last batch norm's scale starts at 0, torchvision's zero_init_residual;
// the shortcut's convolution and that scale get some.)
TEST_CASE("freeze: a tensor unfrozen at a resume steps as a fresh parameter, about lr") {
  TempDir tmp("unfreeze");
  const fs::path job = write_job(tmp.path(), "run");
  const std::vector<std::string> adamw = {"--set", "optimizer.name=adamw",
                                          "--set", "optimizer.weight_decay=0",
                                          "--set", "optimizer.lr=0.001"};
  std::vector<std::string> args = {job.string(), "--set", "train.steps=2"};
  args.insert(args.end(), adamw.begin(), adamw.end());
  RunResult r = run_dtrain(args, tmp.path() / "trained.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const auto trained = model_tensors(tmp.path() / "run");
  const char* const layer4[] = {"layer4.0.downsample.0.weight", "layer4.1.bn2.weight"};
  for (const char* name : layer4)
    CHECK_FALSE(all_zero(state_tensors(tmp.path() / "run", "exp_avg").at(name)));
  args = {job.string(), "--set", "train.steps=4", "--set", "optimizer.freeze=[layer4]",
          "--resume",   "latest"};
  args.insert(args.end(), adamw.begin(), adamw.end());
  r = run_dtrain(args, tmp.path() / "frozen.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const auto before = model_tensors(tmp.path() / "run");
  CHECK(same_bytes(before.at("layer4.0.downsample.0.weight"),
                   trained.at("layer4.0.downsample.0.weight")));
  const runtime::Checkpoint ck =
      runtime::read_checkpoint(newest_checkpoint(tmp.path() / "run" / "checkpoints"));
  CHECK(ck.meta.at("frozen_steps").at("layer4.0.conv1.weight") == 4);  // all 4: no state
  const auto moments = state_tensors(tmp.path() / "run", "exp_avg");
  for (const char* name : layer4) CHECK(all_zero(moments.at(name)));
  CHECK_FALSE(all_zero(moments.at("fc.weight")));
  args = {job.string(), "--set", "train.steps=5", "--resume", "latest"};
  args.insert(args.end(), adamw.begin(), adamw.end());
  r = run_dtrain(args, tmp.path() / "unfrozen.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const auto after = model_tensors(tmp.path() / "run");
  for (const char* name : layer4) {
    CAPTURE(name);
    const Tensor& a = before.at(name);
    const Tensor& b = after.at(name);
    std::vector<double> step;
    for (int64_t i = 0; i < a.numel(); ++i)
      step.push_back(std::fabs(static_cast<double>(b.data<float>()[i]) - a.data<float>()[i]));
    std::nth_element(step.begin(), step.begin() + static_cast<long>(step.size() / 2), step.end());
    CHECK(step[step.size() / 2] / 0.001 == doctest::Approx(1.0).epsilon(0.02));
  }
}

// Patterns may use the names `dtrain ckpt export` writes (Hugging Face's for GPT-2 and
// BERT): a tensor dtrain holds whole is matched by its exported name; one that holds
// several reference tensors (BERT's query, key and value) only by all of them.
TEST_CASE("freeze: the exported names work too, all parts of a fused tensor or none") {
  TempDir tmp("freeze_names");
  const fs::path job = tmp.path() / "job.yaml";
  for (const std::string arch : {"gpt2-tiny", "bert-mini"}) {
    std::ofstream(job) << "run: {output_dir: " << (tmp.path() / "run").string() << "}\n"
                       << "model: {arch: " << arch << ", seq_len: 16, vocab_size: 64}\n"
                       << "data: {dataset: synthetic, global_batch: 2}\n"
                       << "train: {steps: 1}\n";
    const auto validate = [&](const std::string& freeze) {
      return run_dtrain_command(
          {"validate", job.string(), "--no-data", "--set", "optimizer.freeze=" + freeze},
          tmp.path() / "validate.log");
    };
    if (arch == "gpt2-tiny") {
      const RunResult r = validate("[transformer.wte, transformer.h.0.ln_1]");
      CHECK_MESSAGE(r.rc == 0, r.describe());
      CHECK_MESSAGE(contains(r.log, "# optimizer.freeze: 3 of 52 tensors frozen"), r.log);
      const RunResult tied = validate("[lm_head]");  // Hugging Face's copy of the embedding
      CHECK_MESSAGE(tied.rc == 2, tied.describe());
      CHECK_MESSAGE(contains(tied.log, "ties to the word embedding and dtrain holds once"),
                    tied.log);
      CHECK_MESSAGE(contains(tied.log, "freeze transformer.wte"), tied.log);
    } else {
      RunResult r = validate(
          "[bert.embeddings, \"*.self.query.*\", \"*.self.key.*\", "
          "\"*.self.value.*\"]");
      CHECK_MESSAGE(r.rc == 0, r.describe());
      CHECK_MESSAGE(contains(r.log, "# optimizer.freeze: 13 of "), r.log);
      r = validate("[\"*query*\"]");
      CHECK_MESSAGE(r.rc == 2, r.describe());
      CHECK_MESSAGE(
          contains(r.log,
                   "the patterns match bert.encoder.layer.0.attention.self.query.weight but "
                   "not bert.encoder.layer.0.attention.self.key.weight"),
          r.log);
      // A module pattern taking in the tied decoder's name leaves the word table out,
      // and says so (unless another pattern takes it in).
      r = validate("[cls]");
      CHECK_MESSAGE(r.rc == 0, r.describe());
      CHECK_MESSAGE(contains(r.log,
                             "# warning: optimizer.freeze[0]: \"cls\" covers "
                             "cls.predictions.decoder.weight by name, but that is the word "
                             "embedding"),
                    r.log);
      r = validate("[cls, bert.embeddings.word_embeddings]");
      CHECK_MESSAGE(r.rc == 0, r.describe());
      CHECK_MESSAGE(!contains(r.log, "warning: optimizer.freeze"), r.log);
    }
  }
}
