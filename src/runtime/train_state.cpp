// Checkpoint <-> training state. Tensor names: "params.<dtype>", "buffers.<dtype>"
// (the flat stores), "optim.<buffer>" (optimizer state, flat f32). State on a GPU is
// copied to the host to be written and back to the device when loaded, so a
// checkpoint does not depend on the device it was written from.
#include "runtime/train_state.h"

#include "kernels/memory.h"
#include "runtime/checkpoint.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;

namespace {

constexpr DType kStoreTypes[] = {DType::f32, DType::f16, DType::bf16};

nlohmann::json layout_of(const graph::FlatStore& store) {
  nlohmann::json list = nlohmann::json::array();
  for (const graph::FlatEntry& e : store.entries()) {
    list.push_back({e.name, std::string(dtype_name(e.spec.dtype)),
                    std::vector<int64_t>(e.spec.shape.begin(), e.spec.shape.end())});
  }
  return list;
}

void add_store(std::vector<NamedTensor>& out, const std::string& prefix,
               const graph::FlatStore& store) {
  for (DType dt : kStoreTypes) {
    const Tensor t = store.flat(dt);
    if (t.defined())
      out.push_back({prefix + "." + std::string(dtype_name(dt)), kernels::to_host(t)});
  }
}

// Checks `saved` against `live` (same dtype, same byte count) or throws.
void check_same(const Checkpoint& ck, const std::string& name, const Tensor& live) {
  const Tensor& saved = ck.get(name);
  if (saved.dtype() != live.dtype() || saved.nbytes() != live.nbytes()) {
    throw Error(fmt::format("{}: tensor \"{}\" is {}, this run needs {}", ck.file.string(), name,
                            saved.str(), live.str()),
                "the checkpoint was written by a different model or optimizer configuration");
  }
}

void check_layout(const Checkpoint& ck, const char* key, const graph::FlatStore& store) {
  if (ck.meta.value(key, nlohmann::json()) != layout_of(store)) {
    throw Error(fmt::format("{}: the {} layout differs from this model's", ck.file.string(), key),
                "the checkpoint was written for another model (check model.arch and its "
                "options), or pass no --resume to start afresh");
  }
}

void copy_into(const Tensor& from, Tensor to) { kernels::copy(from, to); }

}  // namespace

void save_train_state(const fs::path& file, const graph::FlatStore& params,
                      const graph::FlatStore& buffers, const optim::Optimizer& opt,
                      const TrainCounters& c) {
  std::vector<NamedTensor> tensors;
  add_store(tensors, "params", params);
  add_store(tensors, "buffers", buffers);
  const optim::OptimizerState state = opt.state();
  for (const auto& [name, t] : state.buffers)
    tensors.push_back({"optim." + name, kernels::to_host(t)});
  const nlohmann::json meta = {
      {"format", "dtrain-train-state"},
      {"step", c.step},
      {"data_position", {{"epoch", c.position.epoch}, {"offset", c.position.offset}}},
      {"seed", c.seed},
      {"arch", c.arch},
      {"config_hash", c.config_hash},
      {"optimizer",
       {{
            "name",
            std::string(to_string(opt.name())),
        },
        {"step", state.step}}},
      {"params", layout_of(params)},
      {"buffers", layout_of(buffers)}};
  nlohmann::json full = meta;
  if (c.scaler) {
    full["loss_scaler"] = {{"scale", c.scaler->scale},
                           {"clean_steps", c.scaler->clean_steps},
                           {"overflows_left", c.scaler->overflows_left},
                           {"skipped_steps", c.scaler->skipped_steps}};
  }
  write_checkpoint(file, full, tensors);
}

TrainCounters load_train_state(const fs::path& file, graph::FlatStore& params,
                               graph::FlatStore& buffers, optim::Optimizer& opt) {
  const Checkpoint ck = read_checkpoint(file);  // every checksum verified here
  try {
    if (ck.meta.at("format") != "dtrain-train-state") {
      throw Error(fmt::format("{}: not a training checkpoint", file.string()));
    }
    check_layout(ck, "params", params);
    check_layout(ck, "buffers", buffers);
    const std::string opt_name = ck.meta.at("optimizer").at("name");
    if (opt_name != to_string(opt.name())) {
      throw Error(fmt::format("{}: written with optimizer {}, this job uses {}", file.string(),
                              opt_name, to_string(opt.name())),
                  "resume with the optimizer the run started with");
    }
    optim::OptimizerState state = opt.state();
    for (auto& [name, t] : state.buffers) check_same(ck, "optim." + name, t);
    for (DType dt : kStoreTypes) {
      for (const auto* store : {&params, &buffers}) {
        const Tensor live = store->flat(dt);
        if (live.defined())
          check_same(ck, (store == &params ? "params." : "buffers.") + std::string(dtype_name(dt)),
                     live);
      }
    }
    // Everything fits: only now is live state overwritten.
    for (DType dt : kStoreTypes) {
      const std::string suffix = "." + std::string(dtype_name(dt));
      if (params.flat(dt).defined()) copy_into(ck.get("params" + suffix), params.flat(dt));
      if (buffers.flat(dt).defined()) copy_into(ck.get("buffers" + suffix), buffers.flat(dt));
    }
    optim::OptimizerState restored;
    restored.step = ck.meta.at("optimizer").at("step");
    for (auto& [name, t] : state.buffers)
      restored.buffers.emplace_back(name, ck.get("optim." + name));
    opt.load_state(restored);
    TrainCounters c;
    c.step = ck.meta.at("step");
    c.position = {ck.meta.at("data_position").at("epoch"),
                  ck.meta.at("data_position").at("offset")};
    c.seed = ck.meta.at("seed");
    c.arch = ck.meta.at("arch");
    c.config_hash = ck.meta.at("config_hash");
    if (ck.meta.contains("loss_scaler")) {
      const nlohmann::json& ls = ck.meta.at("loss_scaler");
      precision::LossScalerState st;
      st.scale = ls.at("scale");
      st.clean_steps = ls.at("clean_steps");
      st.overflows_left = ls.at("overflows_left");
      st.skipped_steps = ls.at("skipped_steps");
      if (!(st.scale > 0) || st.clean_steps < 0 || st.skipped_steps < 0) {
        throw Error(
            fmt::format("{}: loss scaler state out of range (scale {})", file.string(), st.scale));
      }
      c.scaler = st;
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed training metadata: {}", file.string(), e.what()),
                "the file passed its checksums but was not written by dtrain train");
  }
}

fs::path resolve_resume(const std::string& resume, const fs::path& checkpoint_dir) {
  fs::path dir = resume == "latest" ? checkpoint_dir : fs::path(resume);
  if (resume != "latest" && fs::is_regular_file(dir)) return dir;
  if (resume == "latest" && !fs::exists(dir)) return {};
  if (!fs::is_directory(dir)) {
    throw Error(fmt::format("--resume {}: no such checkpoint file or directory", resume),
                "pass latest, a .dtckpt file or a checkpoint directory");
  }
  const auto all = list_checkpoints(dir);
  if (all.empty() && resume == "latest") return {};  // nothing saved yet: start afresh
  if (all.empty()) {
    throw Error(
        fmt::format("--resume {}: no checkpoint (step-*.dtckpt) in {}", resume, dir.string()),
        "train without --resume to start afresh");
  }
  return all.back();
}

}  // namespace dtrain::runtime
