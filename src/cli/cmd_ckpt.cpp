// `dtrain ckpt inspect|verify|export PATH`: what a checkpoint holds, whether every
// checksum holds, and its model's weights as a safetensors file under PyTorch names.
// PATH is a step-N.dtckpt file, a sharded step-N/ directory, or a checkpoint directory
// (a run's output directory also works: its checkpoints/). Reading and checking are
// runtime's (read_any_checkpoint verifies everything); nothing here writes a checkpoint.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "runtime/checkpoint.h"
#include "runtime/export_names.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"

namespace dtrain::cli {
namespace {

namespace fs = std::filesystem;

struct CkptArgs {
  std::string path;
  bool json = false;
  std::string out;                     // export: --safetensors
  std::string dtype = "f32";           // export: --dtype
  std::string which_weights = "auto";  // export: --weights
};

bool is_one_checkpoint(const fs::path& p) {
  return fs::is_regular_file(p) || runtime::is_sharded_checkpoint(p);
}

// The checkpoints a directory argument stands for: its own, else its checkpoints/'s.
std::vector<fs::path> checkpoints_in(const fs::path& dir) {
  if (!fs::is_directory(dir)) {
    throw Error(fmt::format("{}: no such checkpoint file or directory", dir.string()),
                "pass a step-N.dtckpt file, a step-N directory or a checkpoint directory");
  }
  std::vector<fs::path> all = runtime::list_checkpoints(dir);
  if (all.empty() && fs::is_directory(dir / "checkpoints"))
    all = runtime::list_checkpoints(dir / "checkpoints");
  if (all.empty()) {
    if (runtime::step_of_name(dir) && dir.extension() != ".dtckpt") {  // a step-N/, damaged
      throw Error(fmt::format("{}: a sharded checkpoint without its manifest.dtckpt", dir.string()),
                  "the save did not finish or the manifest was removed; resume from an older "
                  "checkpoint (they are kept beside it)");
    }
    throw Error(fmt::format("{}: no checkpoint (step-N.dtckpt or step-N/) in it", dir.string()),
                "pass a run's checkpoint directory (run.output_dir/checkpoints)");
  }
  return all;
}

int64_t bytes_on_disk(const fs::path& p) {
  if (fs::is_regular_file(p)) return static_cast<int64_t>(fs::file_size(p));
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(p))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

int64_t step_of_name(const fs::path& p) {
  const std::string stem = p.stem().string();  // step-00000123
  try {
    return std::stoll(stem.substr(stem.find('-') + 1));
  } catch (const std::exception&) {
    return -1;
  }
}

std::string human_bytes(int64_t n) {
  const double b = static_cast<double>(n);
  if (n >= 1'000'000'000) return fmt::format("{:.2f} GB", b / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} MB", b / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", n);
}

std::vector<int64_t> dims(const Shape& s) { return {s.begin(), s.end()}; }

nlohmann::json layout_json(const std::vector<graph::FlatEntry>& entries, int64_t* total) {
  nlohmann::json list = nlohmann::json::array();
  *total = 0;
  for (const graph::FlatEntry& e : entries) {
    list.push_back({{"name", e.name},
                    {"dtype", dtype_name(e.spec.dtype)},
                    {"shape", dims(e.spec.shape)},
                    {"elements", e.spec.shape.numel()},
                    {"offset", e.offset}});
    *total += e.spec.shape.numel();
  }
  return list;
}

nlohmann::json tensor_json(const runtime::NamedTensor& t) {
  return {{"name", t.name},
          {"dtype", dtype_name(t.tensor.dtype())},
          {"shape", dims(t.tensor.shape())},
          {"bytes", t.tensor.nbytes()}};
}

// Whether a checkpoint's meta marks its step's evaluation pending (a damaged value: no).
bool eval_pending(const nlohmann::json& meta) {
  const auto it = meta.find("eval_pending");
  return it != meta.end() && it->is_boolean() && it->get<bool>();
}

// One checkpoint, verified, as JSON (the text form prints the same fields).
nlohmann::json describe(const fs::path& path) {
  const runtime::Checkpoint ck = runtime::read_any_checkpoint(path);
  const nlohmann::json& m = ck.meta;
  nlohmann::json out = {{"path", path.string()},
                        {"kind", runtime::is_sharded_checkpoint(path) ? "sharded" : "file"},
                        {"bytes", bytes_on_disk(path)}};
  for (const char* key : {"format", "step", "data_position", "seed", "arch", "model", "config_hash",
                          "optimizer", "loss_scaler"})
    out[key] = m.value(key, nlohmann::json());
  if (m.contains("best_eval")) {  // train.best: the readable fields, not the bits
    nlohmann::json b = m.at("best_eval");
    for (const char* bits : {"loss_bits", "accuracy_bits", "reference_bits"}) b.erase(bits);
    out["best_eval"] = b;
  }
  if (m.contains("frozen_steps")) out["frozen_steps"] = m.at("frozen_steps");
  if (eval_pending(m)) out["eval_pending"] = true;
  // An image folder's class names by label; comm.allreduce auto's timed table, which a
  // resume on the same layout keeps.
  for (const char* key : {"classes", "allreduce_auto"})
    if (m.contains(key)) out[key] = m.at(key);
  if (runtime::is_sharded_checkpoint(path)) {
    const runtime::Checkpoint man = runtime::read_checkpoint(path / "manifest.dtckpt");
    nlohmann::json sh = man.meta.at("sharded");
    for (nlohmann::json& s : sh.at("shards")) {
      s["elements"] = s.at("end").get<int64_t>() - s.at("begin").get<int64_t>();
      // Each rank's own state (gradient compression's error feedback), which a resume in
      // the same layout reads back and the one-process view above leaves out.
      // read_any_checkpoint verified the shard whole: only these blobs are read again.
      nlohmann::json own = nlohmann::json::array();
      const auto compress = [](const std::string& name) { return name.rfind("compress.", 0) == 0; };
      for (const runtime::NamedTensor& t :
           runtime::read_checkpoint_blobs(path / s.at("file").get<std::string>(), compress).tensors)
        own.push_back(tensor_json(t));
      s["rank_state"] = own;
    }
    out["sharded"] = sh;
  }
  int64_t params = 0, buffers = 0;
  out["params"] = layout_json(runtime::layout_from_meta(m.at("params")), &params);
  out["buffers"] =
      layout_json(runtime::layout_from_meta(m.value("buffers", nlohmann::json::array())), &buffers);
  out["parameters"] = params;
  out["buffer_elements"] = buffers;
  nlohmann::json stored = nlohmann::json::array();
  for (const runtime::NamedTensor& t : ck.tensors) stored.push_back(tensor_json(t));
  out["stored"] = stored;
  out["ema"] = runtime::holds_average(ck);  // which predict, generate and export read
  return out;
}

std::string shape_text(const nlohmann::json& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + shape[i].dump();
  return s + "]";
}

void print_layout(const char* what, const nlohmann::json& list, int64_t total) {
  std::printf("%s: %zu tensors, %lld elements\n", what, list.size(), static_cast<long long>(total));
  size_t width = 0;
  for (const nlohmann::json& e : list)
    width = std::max(width, e.at("name").get<std::string>().size());
  for (const nlohmann::json& e : list) {
    std::printf("  %-*s %-4s %-18s %lld\n", static_cast<int>(width),
                e.at("name").get<std::string>().c_str(), e.at("dtype").get<std::string>().c_str(),
                shape_text(e.at("shape")).c_str(),
                static_cast<long long>(e.at("elements").get<int64_t>()));
  }
}

void print_one(const nlohmann::json& d) {
  std::printf("checkpoint: %s (%s, %s on disk, every checksum verified)\n",
              d.at("path").get<std::string>().c_str(), d.at("kind").get<std::string>().c_str(),
              human_bytes(d.at("bytes").get<int64_t>()).c_str());
  std::printf("step: %s\n", d.at("step").dump().c_str());
  const nlohmann::json& pos = d.at("data_position");
  if (pos.is_object()) {
    std::printf("data position: epoch %s, offset %s\n", pos.at("epoch").dump().c_str(),
                pos.at("offset").dump().c_str());
  }
  std::printf("arch: %s\nseed: %s\n", d.at("arch").get<std::string>().c_str(),
              d.at("seed").dump().c_str());
  const nlohmann::json& model = d.at("model");  // what no tensor's shape shows
  if (model.is_object() && model.contains("heads"))
    std::printf("attention heads: %s\n", model.at("heads").dump().c_str());
  const nlohmann::json& opt = d.at("optimizer");
  if (opt.is_object()) {
    std::printf("optimizer: %s, step %s%s\n", opt.at("name").get<std::string>().c_str(),
                opt.at("step").dump().c_str(),
                d.value("ema", false)
                    ? "; with an average of the weights (optimizer.ema: --weights ema, the "
                      "default of predict, generate and ckpt export)"
                    : "");
  }
  const nlohmann::json& ls = d.at("loss_scaler");
  if (ls.is_object()) {
    std::printf("loss scaler: scale %s, %s clean steps, %s overflows left, %s skipped steps\n",
                ls.at("scale").dump().c_str(), ls.at("clean_steps").dump().c_str(),
                ls.at("overflows_left").dump().c_str(), ls.at("skipped_steps").dump().c_str());
  } else {
    std::printf("loss scaler: none\n");
  }
  if (d.contains("best_eval")) {
    const nlohmann::json& b = d.at("best_eval");
    std::printf(
        "best evaluation (train.best, by %s): step %s, test loss %s, test accuracy %s; "
        "%s evaluation(s) since a gain%s\n",
        b.at("metric").get<std::string>().c_str(), b.at("step").dump().c_str(),
        b.at("loss").dump().c_str(), b.at("accuracy").dump().c_str(),
        b.at("stale_evals").dump().c_str(),
        b.at("stopped_early").get<bool>() ? "; the run stopped early here" : "");
  }
  if (d.contains("frozen_steps")) {  // optimizer.freeze: the tensors, and for how long
    std::map<int64_t, int> by_count;
    for (const auto& [name, steps] : d.at("frozen_steps").items()) ++by_count[steps.get<int64_t>()];
    std::string text;
    for (const auto& [steps, tensors] : by_count)
      text +=
          fmt::format("{}{} tensor(s) for {} step(s)", text.empty() ? "" : ", ", tensors, steps);
    std::printf("steps frozen (optimizer.freeze, up to this step): %s\n", text.c_str());
  }
  if (d.contains("classes") && d.at("classes").is_array()) {
    const nlohmann::json& names = d.at("classes");
    std::string text;
    for (size_t i = 0; i < names.size() && i < 10; ++i)
      text += fmt::format("{}{} {}", i ? ", " : "", i,
                          names[i].is_string() ? names[i].get<std::string>() : names[i].dump());
    if (names.size() > 10) text += fmt::format(", ... ({} more)", names.size() - 10);
    std::printf("classes (label: directory): %zu: %s\n", names.size(), text.c_str());
  }
  if (d.contains("allreduce_auto") && d.at("allreduce_auto").is_object()) {
    const nlohmann::json& a = d.at("allreduce_auto");
    std::string table;
    if (a.contains("classes") && a.at("classes").is_array()) {
      for (const nlohmann::json& c : a.at("classes")) {
        if (!c.is_object() || !c.contains("bytes") || !c.contains("algo")) continue;
        table += fmt::format(
            "{}{} -> {}", table.empty() ? "" : ", ",
            c.at("bytes").is_number_integer() ? human_bytes(c.at("bytes").get<int64_t>())
                                              : c.at("bytes").dump(),
            c.at("algo").is_string() ? c.at("algo").get<std::string>() : c.at("algo").dump());
      }
    }
    const std::string grid =
        a.contains("grid") && a.at("grid").is_array() && a.at("grid").size() == 3
            ? fmt::format(", grid {} x {} x {} (pipeline x data x tensor)", a.at("grid")[0].dump(),
                          a.at("grid")[1].dump(), a.at("grid")[2].dump())
            : "";
    std::printf("all-reduce auto (comm.allreduce): timed on %s data ranks (%s)%s: %s\n",
                a.value("world", nlohmann::json()).dump().c_str(),
                a.contains("backend") && a.at("backend").is_string()
                    ? a.at("backend").get<std::string>().c_str()
                    : "?",
                grid.c_str(), table.empty() ? "no size classes" : table.c_str());
  }
  if (d.contains("eval_pending")) {
    std::printf(
        "evaluation pending: the step's evaluation could not read its test data; a resume "
        "evaluates it first\n");
  }
  if (d.contains("sharded")) {
    const nlohmann::json& sh = d.at("sharded");
    // "world": the ranks that wrote it (a pipeline's: one data replica of each stage).
    std::printf("sharded: %s shards, zero stage %s, precision %s, %s elements (padding included)\n",
                sh.at("world").dump().c_str(), sh.at("zero_stage").dump().c_str(),
                sh.at("precision").get<std::string>().c_str(), sh.at("total").dump().c_str());
    for (const nlohmann::json& s : sh.at("shards")) {
      std::printf("  rank %s: [%s, %s) %s elements, %s, %s\n", s.at("rank").dump().c_str(),
                  s.at("begin").dump().c_str(), s.at("end").dump().c_str(),
                  s.at("elements").dump().c_str(), s.at("file").get<std::string>().c_str(),
                  human_bytes(s.at("bytes").get<int64_t>()).c_str());
      if (!s.at("rank_state").empty()) {
        std::printf("    own state:");
        for (const nlohmann::json& t : s.at("rank_state")) {
          std::printf(" %s %s%s", t.at("name").get<std::string>().c_str(),
                      t.at("dtype").get<std::string>().c_str(), shape_text(t.at("shape")).c_str());
        }
        std::printf("\n");
      }
    }
  }
  print_layout("parameters", d.at("params"), d.at("parameters").get<int64_t>());
  if (!d.at("buffers").empty())
    print_layout("buffers", d.at("buffers"), d.at("buffer_elements").get<int64_t>());
  std::printf("stored:");
  for (const nlohmann::json& t : d.at("stored")) {
    std::printf(" %s %s%s", t.at("name").get<std::string>().c_str(),
                t.at("dtype").get<std::string>().c_str(), shape_text(t.at("shape")).c_str());
  }
  std::printf("\n");
}

// A checkpoint directory: step, kind, world, ZeRO stage and size of each, and whether its
// evaluation is pending (headers only: a single file's header, a sharded checkpoint's
// manifest).
int list_dir(const fs::path& dir, bool json) {
  nlohmann::json list = nlohmann::json::array();
  const std::vector<fs::path> all = checkpoints_in(dir);
  // train.best's record beside them (an unreadable one marks nothing here).
  std::optional<int64_t> best;
  try {
    if (!all.empty()) best = runtime::best_record_step(all.front().parent_path());
  } catch (const Error&) {
  }
  for (const fs::path& p : all) {
    nlohmann::json row = {{"path", p.string()},
                          {"step", step_of_name(p)},
                          {"kind", "file"},
                          {"world", nullptr},
                          {"zero_stage", 0},
                          {"bytes", bytes_on_disk(p)},
                          {"best", best.has_value() && step_of_name(p) == best},
                          {"eval_pending", false}};
    if (runtime::is_sharded_checkpoint(p)) {
      const runtime::Checkpoint man = runtime::read_checkpoint(p / "manifest.dtckpt");
      row["kind"] = "sharded";
      row["step"] = man.meta.value("step", int64_t{-1});
      row["world"] = man.meta.at("sharded").at("world");
      row["zero_stage"] = man.meta.at("sharded").at("zero_stage");
      row["eval_pending"] = eval_pending(man.meta);
    } else {
      try {  // a damaged header marks nothing here; inspect FILE or verify names it
        const auto none = [](const std::string&) { return false; };
        row["eval_pending"] = eval_pending(runtime::read_checkpoint_blobs(p, none).meta);
      } catch (const Error&) {
      }
    }
    list.push_back(row);
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"checkpoints", list}}.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-10s %-8s %-6s %-5s %-12s %s\n", "step", "kind", "shards", "zero", "size", "path");
  for (const nlohmann::json& r : list) {
    std::printf("%-10s %-8s %-6s %-5s %-12s %s\n", r.at("step").dump().c_str(),
                r.at("kind").get<std::string>().c_str(),
                r.at("world").is_null() ? "-" : r.at("world").dump().c_str(),
                r.at("zero_stage").dump().c_str(),
                human_bytes(r.at("bytes").get<int64_t>()).c_str(),
                r.at("path").get<std::string>().c_str());
    if (r.at("best").get<bool>()) std::printf("%-10s (the best evaluation's: best.json)\n", "");
    if (r.at("eval_pending").get<bool>()) {
      std::printf(
          "%-10s (its evaluation is pending: the test data could not be read; a "
          "resume evaluates it first)\n",
          "");
    }
  }
  return kExitOk;
}

// A .safetensors file (an export, a model.init_from file): its tensors by the names it
// holds, which optimizer.freeze's patterns may use too.
int inspect_safetensors(const fs::path& path, bool json) {
  const runtime::SafetensorsFile f = runtime::read_safetensors(path);
  nlohmann::json list = nlohmann::json::array();
  int64_t total = 0;
  for (const runtime::NamedTensor& t : f.tensors) {
    list.push_back(
        {{"name", t.name},
         {"dtype", std::string(dtype_name(t.tensor.dtype()))},
         {"shape", std::vector<int64_t>(t.tensor.shape().begin(), t.tensor.shape().end())},
         {"elements", t.tensor.numel()}});
    total += t.tensor.numel();
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"path", path.string()},
                                       {"kind", "safetensors"},
                                       {"metadata", f.metadata},
                                       {"tensors", list}}
                            .dump(2)
                            .c_str());
    return kExitOk;
  }
  std::printf("safetensors: %s (%s)\n", path.string().c_str(),
              human_bytes(static_cast<int64_t>(fs::file_size(path))).c_str());
  for (const auto& [key, value] : f.metadata) std::printf("%s: %s\n", key.c_str(), value.c_str());
  print_layout("tensors", list, total);
  return kExitOk;
}

int run_inspect(const CkptArgs& a) {
  const fs::path path = a.path;
  if (fs::is_regular_file(path) && path.extension() == ".safetensors")
    return inspect_safetensors(path, a.json);
  if (!is_one_checkpoint(path)) return list_dir(path, a.json);
  const nlohmann::json d = describe(path);
  if (a.json) {
    std::printf("%s\n", d.dump(2).c_str());
  } else {
    print_one(d);
  }
  return kExitOk;
}

// "ok: PATH (step 6, 5 tensors, 1.2 MB)" after every checksum, or the Error. One file of
// a sharded step-N/ (a rank's shard, the manifest) is verified on its own: its checksums.
std::string verify_one(const fs::path& path) {
  const bool part = fs::is_regular_file(path) && path.has_parent_path() &&
                    runtime::is_sharded_checkpoint(path.parent_path());
  const runtime::Checkpoint ck =
      part ? runtime::read_checkpoint(path) : runtime::read_any_checkpoint(path);
  return fmt::format("ok: {} (step {}, {} tensors, {} verified)", path.string(),
                     ck.meta.value("step", nlohmann::json()).dump(), ck.tensors.size(),
                     human_bytes(bytes_on_disk(path)));
}

int run_verify(const CkptArgs& a) {
  const fs::path path = a.path;
  if (is_one_checkpoint(path)) {
    std::printf("%s\n", verify_one(path).c_str());
    return kExitOk;
  }
  const std::vector<fs::path> all = checkpoints_in(path);
  int damaged = 0;
  for (const fs::path& p : all) {
    try {
      std::printf("%s\n", verify_one(p).c_str());
    } catch (const Error& e) {
      ++damaged;
      std::printf("damaged: %s\n", e.message().c_str());
    }
    std::fflush(stdout);
  }
  if (damaged > 0) {
    throw Error(
        fmt::format("{}: {} of {} checkpoints are damaged", path.string(), damaged, all.size()),
        "resume from an undamaged one (--resume <its path>)");
  }
  return kExitOk;
}

int run_export(const CkptArgs& a) {
  const fs::path path =
      is_one_checkpoint(a.path) ? fs::path(a.path) : checkpoints_in(a.path).back();
  const std::string name = a.dtype == "fp32" ? "f32" : a.dtype == "fp16" ? "f16" : a.dtype;
  const DType dtype = parse_dtype(name);
  runtime::Checkpoint ck = runtime::read_any_checkpoint(path);
  const bool average = runtime::select_weights(ck, a.which_weights) == "ema";
  const runtime::ExportSummary s = runtime::export_safetensors(ck, a.out, dtype, average);
  std::printf("wrote %s: %lld tensors, %lld elements in %s, %s (%s, step %s, %s, from %s)\n",
              a.out.c_str(), static_cast<long long>(s.tensors), static_cast<long long>(s.elements),
              name.c_str(), human_bytes(s.bytes).c_str(), s.arch.c_str(),
              ck.meta.value("step", nlohmann::json()).dump().c_str(),
              average ? "EMA weights" : "the weights", path.string().c_str());
  return kExitOk;
}

}  // namespace

void add_ckpt(CLI::App& app, Action& action) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect, verify or export checkpoints");
  ckpt->require_subcommand(1);

  auto inspect = std::make_shared<CkptArgs>();
  CLI::App* cmd = ckpt->add_subcommand(
      "inspect",
      "print a checkpoint's step, data position, optimizer, shards and tensors (or list the "
      "checkpoints of a directory, or a .safetensors file's tensors)");
  cmd->add_option("path", inspect->path,
                  "a step-N.dtckpt file, a step-N/ directory, a "
                  "checkpoint directory or a .safetensors file")
      ->required();
  cmd->add_flag("--json", inspect->json, "print JSON");
  cmd->callback([inspect, &action] { action = [inspect] { return run_inspect(*inspect); }; });

  auto verify = std::make_shared<CkptArgs>();
  cmd = ckpt->add_subcommand(
      "verify",
      "check every checksum of a checkpoint (or of each in a directory); exit 2 on damage");
  cmd->add_option("path", verify->path,
                  "a checkpoint file, step-N/ directory or checkpoint directory")
      ->required();
  cmd->callback([verify, &action] { action = [verify] { return run_verify(*verify); }; });

  auto exp = std::make_shared<CkptArgs>();
  cmd = ckpt->add_subcommand(
      "export",
      "write a checkpoint's model weights as a safetensors file with PyTorch names "
      "(torchvision ResNet / ViT, Hugging Face BERT / GPT-2)");
  cmd->add_option("path", exp->path,
                  "a checkpoint file, step-N/ directory, or a directory (its newest)")
      ->required();
  cmd->add_option("--safetensors", exp->out, "the file to write")->required();
  // The job file's names (precision.dtype: fp32 | bf16 | fp16) are accepted too.
  cmd->add_option("--dtype", exp->dtype, "f32 (default), bf16 or f16 (or fp32, fp16)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "fp32", "fp16"}));
  add_weights_option(cmd, exp->which_weights);
  cmd->callback([exp, &action] { action = [exp] { return run_export(*exp); }; });
}

}  // namespace dtrain::cli
