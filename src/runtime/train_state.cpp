// Checkpoint <-> training state. Tensor names: "params.<dtype>", "buffers.<dtype>"
// (the flat stores), "optim.<buffer>" (optimizer state, flat f32). State on a GPU is
// copied to the host to be written and back to the device when loaded, so a
// checkpoint does not depend on the device it was written from.
#include "runtime/train_state.h"

#include <bit>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "core/checksum.h"
#include "data/atomic_file.h"
#include "kernels/memory.h"
#include "runtime/checkpoint.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;

namespace {

constexpr DType kStoreTypes[] = {DType::f32, DType::f16, DType::bf16};
// Elements read at a time while resuming (256 KiB of f32): the only memory loading takes
// beside the live state.
constexpr int64_t kLoadPiece = int64_t{1} << 16;

nlohmann::json layout_of(const std::vector<graph::FlatEntry>& entries) {
  nlohmann::json list = nlohmann::json::array();
  for (const graph::FlatEntry& e : entries) {
    list.push_back({e.name, std::string(dtype_name(e.spec.dtype)),
                    std::vector<int64_t>(e.spec.shape.begin(), e.spec.shape.end())});
  }
  return list;
}

nlohmann::json layout_of(const graph::FlatStore& store) { return layout_of(store.entries()); }

// The training metadata of a checkpoint, single file or sharded.
nlohmann::json train_meta(nlohmann::json params_layout, const graph::FlatStore& buffers,
                          OptimizerName opt, int64_t opt_step, const TrainCounters& c) {
  nlohmann::json meta = {
      {"format", "dtrain-train-state"},
      {"step", c.step},
      {"data_position", {{"epoch", c.position.epoch}, {"offset", c.position.offset}}},
      {"seed", c.seed},
      {"arch", c.arch},
      {"config_hash", c.config_hash},
      {"job_yaml", c.job_yaml},
      {"optimizer", {{"name", std::string(to_string(opt))}, {"step", opt_step}}},
      {"params", std::move(params_layout)},
      {"buffers", layout_of(buffers)}};
  if (c.heads > 0) meta["model"] = {{"heads", c.heads}};
  if (!c.classes.empty()) meta["classes"] = c.classes;
  if (!c.frozen_steps.empty()) meta["frozen_steps"] = c.frozen_steps;
  if (c.eval_pending) meta["eval_pending"] = true;
  if (c.allreduce_auto) {
    nlohmann::json classes = nlohmann::json::array();
    for (const auto& [bytes, algo] : c.allreduce_auto->classes)
      classes.push_back({{"bytes", bytes}, {"algo", algo}});
    meta["allreduce_auto"] = {{"world", c.allreduce_auto->world},
                              {"backend", c.allreduce_auto->backend},
                              {"buckets", c.allreduce_auto->buckets},
                              {"classes", classes}};
    if (!c.allreduce_auto->grid.empty()) {
      meta["allreduce_auto"]["grid"] = c.allreduce_auto->grid;
      meta["allreduce_auto"]["signature"] = fmt::format("{:016x}", c.allreduce_auto->signature);
    }
  }
  // As bits: a decimal round trip could change the logged mean's last bit.
  meta["log_window"] = {{"loss_sum_bits", std::bit_cast<uint64_t>(c.window_loss_sum)},
                        {"losses", c.window_losses},
                        {"last_loss_bits", std::bit_cast<uint64_t>(c.last_loss)}};
  if (c.best) {  // values as bits too: a resumed run compares with exactly these
    const BestEval& b = *c.best;
    meta["best_eval"] = {{"metric", b.metric},
                         {"step", b.step},
                         {"loss", b.loss},
                         {"accuracy", b.accuracy},
                         {"loss_bits", std::bit_cast<uint64_t>(b.loss)},
                         {"accuracy_bits", std::bit_cast<uint64_t>(b.accuracy)},
                         {"reference_bits", std::bit_cast<uint64_t>(b.reference)},
                         {"stale_evals", b.stale_evals},
                         {"stopped_early", b.stopped},
                         {"weights", b.weights}};
  }
  if (c.scaler) {
    meta["loss_scaler"] = {{"scale", c.scaler->scale},
                           {"clean_steps", c.scaler->clean_steps},
                           {"overflows_left", c.scaler->overflows_left},
                           {"skipped_steps", c.scaler->skipped_steps}};
  }
  return meta;
}

// Byte count and CRC-32C of a whole file.
std::pair<int64_t, uint32_t> file_crc(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error(fmt::format("{}: cannot read it", file.string()),
                "check the checkpoint directory's permissions");
  }
  std::vector<char> buf(size_t{4} << 20);
  uint32_t crc = 0;
  int64_t bytes = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(in.gcount());
    crc = crc32c(buf.data(), n, crc);
    bytes += static_cast<int64_t>(n);
  }
  return {bytes, crc};
}

std::string shard_file_name(int rank, int world) {
  return fmt::format("rank-{:05d}-of-{:05d}.dtckpt", rank, world);
}

[[noreturn]] void bad_shard(const fs::path& file, const std::string& what) {
  throw Error(fmt::format("{}: {}", file.string(), what),
              "this sharded checkpoint is damaged or incomplete: resume from an earlier one "
              "(--resume <checkpoint dir>/step-N), or verify it with the manifest's owner");
}

// Blobs beyond the parameters, buffers and optimizer state (save_train_state's
// `extra`): every name outside those three families.
bool is_extra_blob(const std::string& name) {
  return name != "params" && name.rfind("params.", 0) != 0 && name.rfind("optim.", 0) != 0 &&
         name.rfind("buffers.", 0) != 0;
}

struct ShardRef {
  int rank = 0;
  int64_t begin = 0, end = 0;
  fs::path file;
};

// The manifest's shards, each checked: a plain file name, the ranges tiling
// [0, total) in rank order, the file present with the manifest's size and CRC-32C.
std::vector<ShardRef> checked_shards(const fs::path& dir, const Checkpoint& man) {
  const fs::path manifest = dir / "manifest.dtckpt";
  if (man.meta.at("format") != "dtrain-sharded-train-state")
    bad_shard(manifest, "not the manifest of a sharded training checkpoint");
  const nlohmann::json& sh = man.meta.at("sharded");
  const int64_t total = sh.at("total");
  const nlohmann::json& shards = sh.at("shards");
  const int world = sh.at("world");
  if (total < 0 || world < 1 || shards.size() != static_cast<size_t>(world))
    bad_shard(manifest, fmt::format("{} shards listed for a world of {}", shards.size(), world));
  std::vector<ShardRef> out;
  int64_t covered = 0;
  for (int index = 0; index < world; ++index) {
    const nlohmann::json& e = shards.at(static_cast<size_t>(index));
    ShardRef r;
    r.rank = e.at("rank");
    r.begin = e.at("begin");
    r.end = e.at("end");
    const std::string name = e.at("file");
    r.file = dir / name;
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
      bad_shard(manifest, fmt::format("shard {} names the file \"{}\"", r.rank, name));
    }
    if (r.rank != index || r.begin != covered || r.end < r.begin || r.end > total) {
      bad_shard(manifest, fmt::format("shard {} covers [{}, {}), expected to start at {}", r.rank,
                                      r.begin, r.end, covered));
    }
    std::error_code ec;
    if (!fs::is_regular_file(r.file, ec)) bad_shard(r.file, "this shard is missing");
    const auto [bytes, crc] = file_crc(r.file);
    if (bytes != e.at("bytes").get<int64_t>() || crc != e.at("crc32c").get<uint32_t>()) {
      bad_shard(r.file, fmt::format("{} bytes with CRC-32C {:08x}; the manifest says {} bytes "
                                    "with {:08x} (changed, truncated, or from another save)",
                                    bytes, crc, e.at("bytes").get<int64_t>(),
                                    e.at("crc32c").get<uint32_t>()));
    }
    covered = r.end;
    out.push_back(r);
  }
  if (covered != total)
    bad_shard(manifest, fmt::format("the shards cover {} of {} elements", covered, total));
  return out;
}

// A shard opened for reading piece by piece (checked_shards verified the file whole),
// its meta checked against the manifest's.
CheckpointReader open_shard(const ShardRef& r, const Checkpoint& man) {
  CheckpointReader rd(r.file, /*verify=*/false);
  const nlohmann::json& m = rd.meta();
  if (m.value("save_id", int64_t{-1}) != man.meta.at("save_id").get<int64_t>() ||
      m.value("rank", -1) != r.rank || m.value("begin", int64_t{-1}) != r.begin ||
      m.value("end", int64_t{-1}) != r.end) {
    bad_shard(r.file, "this shard belongs to another save or another rank than the manifest's");
  }
  return rd;
}

// One shard's blobs that `want` names, its meta checked against the manifest's.
Checkpoint read_shard(const ShardRef& r, const Checkpoint& man,
                      const std::function<bool(const std::string&)>& want) {
  return open_shard(r, man).read_wanted(want);
}

std::string blob_str(const CheckpointReader::Blob& b) {
  return fmt::format("{}{}", dtype_name(b.dtype), b.shape.str());
}

// A shard's f32 range blob `name`, checked for its size.
const CheckpointReader::Blob& range_blob(const CheckpointReader& rd, const ShardRef& r,
                                         const std::string& name) {
  const CheckpointReader::Blob& part = rd.blob(name);
  if (part.dtype != DType::f32 || part.shape.numel() != r.end - r.begin)
    bad_shard(r.file, fmt::format("\"{}\" is {}, expected f32 [{}]", name, blob_str(part),
                                  r.end - r.begin));
  return part;
}

Checkpoint consolidate(const fs::path& dir) {
  const fs::path manifest = dir / "manifest.dtckpt";
  const Checkpoint man = read_checkpoint(manifest);  // its own checksums
  try {
    const std::vector<ShardRef> shards = checked_shards(dir, man);
    const nlohmann::json& sh = man.meta.at("sharded");
    const int64_t total = sh.at("total");
    const auto names = sh.at("optimizer_buffers").get<std::vector<std::string>>();
    Tensor params = Tensor::empty({total}, DType::f32);
    std::vector<Tensor> state;
    for (size_t i = 0; i < names.size(); ++i) state.push_back(Tensor::empty({total}, DType::f32));
    std::vector<NamedTensor> buffers;
    for (const ShardRef& r : shards) {
      const Checkpoint ck = read_shard(r, man, [](const std::string&) { return true; });
      auto put = [&](const std::string& name, Tensor& whole) {
        const Tensor& part = ck.get(name);
        if (part.dtype() != DType::f32 || part.numel() != r.end - r.begin)
          bad_shard(r.file, fmt::format("\"{}\" is {}, expected f32 [{}]", name, part.str(),
                                        r.end - r.begin));
        std::memcpy(whole.data<float>() + r.begin, part.raw(), part.nbytes());
      };
      put("params", params);
      for (size_t i = 0; i < names.size(); ++i) put("optim." + names[i], state[i]);
      if (r.rank == 0) {
        for (const NamedTensor& t : ck.tensors)
          if (t.name.rfind("buffers.", 0) == 0) buffers.push_back(t);
      }
    }
    Checkpoint out;
    out.file = dir;
    out.meta = man.meta;
    out.meta["format"] = "dtrain-train-state";
    out.meta.erase("sharded");
    out.meta.erase("save_id");
    out.tensors.push_back({"params.f32", params});
    for (NamedTensor& b : buffers) out.tensors.push_back(std::move(b));
    for (size_t i = 0; i < names.size(); ++i)
      out.tensors.push_back({"optim." + names[i], state[i]});
    return out;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed manifest: {}", manifest.string(), e.what()),
                "the file passed its checksums but was not written by dtrain train");
  }
}

void add_store(std::vector<NamedTensor>& out, const std::string& prefix,
               const graph::FlatStore& store) {
  for (DType dt : kStoreTypes) {
    const Tensor t = store.flat(dt);
    if (t.defined())
      out.push_back({prefix + "." + std::string(dtype_name(dt)), kernels::to_host(t)});
  }
}

// Checks the blob `name` against `live` (same dtype, same byte count) or throws.
void check_same(const CheckpointReader& rd, const std::string& name, const Tensor& live) {
  const CheckpointReader::Blob& saved = rd.blob(name);
  if (saved.dtype != live.dtype() || saved.bytes != live.nbytes()) {
    throw Error(fmt::format("{}: tensor \"{}\" is {}, this run needs {}", rd.file().string(), name,
                            blob_str(saved), live.str()),
                "the checkpoint was written by a different model or optimizer configuration");
  }
}

void check_layout(const Checkpoint& ck, const char* key, const nlohmann::json& layout) {
  const nlohmann::json saved = ck.meta.value(key, nlohmann::json::array());
  if (saved == layout) return;
  // The first entry that differs ([name, dtype, shape] each), or the one only one side has.
  std::string where;
  const size_t n = std::min(saved.size(), layout.size());
  size_t i = 0;
  while (i < n && saved[i] == layout[i]) ++i;
  if (i < n) {
    where = fmt::format(": its entry {} is {}, this model's is {}", i, saved[i].dump(),
                        layout[i].dump());
  } else {
    where = fmt::format(": it has {} entries, this model {} (first extra: {})", saved.size(),
                        layout.size(), (saved.size() > n ? saved : layout)[n].dump());
  }
  throw Error(
      fmt::format("{}: the {} layout differs from this model's{}", ck.file.string(), key, where),
      "the checkpoint was written for another model (check model.arch and its options). "
      "To start this model from its weights (a new task head, say), export it (dtrain "
      "ckpt export CHECKPOINT --safetensors F) and set model.init_from: F; or pass no "
      "--resume to start afresh");
}

void copy_into(const Tensor& from, Tensor to) { kernels::copy(from, to); }

}  // namespace

void save_train_state(const fs::path& file, const graph::FlatStore& params,
                      const graph::FlatStore& buffers, const optim::Optimizer& opt,
                      const TrainCounters& c, const std::vector<NamedTensor>& extra) {
  std::vector<NamedTensor> tensors;
  add_store(tensors, "params", params);
  add_store(tensors, "buffers", buffers);
  const optim::OptimizerState state = opt.state();
  for (const auto& [name, t] : state.buffers)
    tensors.push_back({"optim." + name, kernels::to_host(t)});
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  write_checkpoint(file, train_meta(layout_of(params), buffers, opt.name(), state.step, c),
                   tensors);
}

void save_sharded_state(const fs::path& dir, const ShardedSave& s, const TrainCounters& c) {
  dist::Communicator& comm = *s.comm;
  const int rank = comm.rank(), world = comm.size();
  const fs::path partial = dir.string() + ".partial";
  // One id for this save, chosen by rank 0 after it cleared the partial directory; the
  // broadcast also holds every rank until that directory exists.
  int64_t id = 0;
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    if (ec) {
      throw Error(fmt::format("{}: cannot create it: {}", partial.string(), ec.message()),
                  "check the disk space and permissions of the checkpoint directory");
    }
    std::random_device rd;
    id = static_cast<int64_t>((uint64_t{rd()} << 31) ^ rd());
  }
  Tensor id_t = Tensor::wrap(&id, Shape{1}, DType::i64);
  comm.broadcast(id_t, 0);

  auto phase = [&](std::string_view name) {
    if (s.at_phase) s.at_phase(name);
  };
  phase("shard");
  std::vector<NamedTensor> tensors = {{"params", kernels::to_host(s.params)}};
  if (rank == 0) add_store(tensors, "buffers", *s.buffers);
  const optim::OptimizerState state = s.opt->state();
  std::vector<std::string> names;
  for (const auto& [name, t] : state.buffers) {
    const Tensor part = s.opt_base ? t.view(s.begin - *s.opt_base, Shape{s.end - s.begin}) : t;
    tensors.push_back({"optim." + name, kernels::to_host(part)});
    names.push_back(name);
  }
  tensors.insert(tensors.end(), s.extra.begin(), s.extra.end());
  const fs::path mine = partial / shard_file_name(rank, world);
  write_checkpoint(mine,
                   {{"format", "dtrain-train-state-shard"},
                    {"save_id", id},
                    {"step", c.step},
                    {"rank", rank},
                    {"world", world},
                    {"begin", s.begin},
                    {"end", s.end}},
                   tensors);  // fsynced, renamed into place
  phase("written");
  const auto [bytes, crc] = file_crc(mine);
  std::array<int64_t, 4> row = {s.begin, s.end, bytes, static_cast<int64_t>(crc)};
  std::vector<int64_t> rows(static_cast<size_t>(4 * world));
  const Tensor row_t = Tensor::wrap(row.data(), Shape{4}, DType::i64);
  Tensor rows_t = Tensor::wrap(rows.data(), Shape{4 * world}, DType::i64);
  comm.all_gather(row_t, rows_t);  // after every rank's shard is on disk

  if (rank == 0) {
    nlohmann::json shards = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      const int64_t* x = rows.data() + 4 * r;
      shards.push_back({{"rank", r},
                        {"file", shard_file_name(r, world)},
                        {"begin", x[0]},
                        {"end", x[1]},
                        {"bytes", x[2]},
                        {"crc32c", static_cast<uint32_t>(x[3])}});
    }
    nlohmann::json meta =
        train_meta(layout_of(*s.layout), *s.buffers, s.opt->name(), state.step, c);
    meta["format"] = "dtrain-sharded-train-state";
    meta["save_id"] = id;
    meta["sharded"] = {{"world", world},   {"zero_stage", s.zero_stage}, {"precision", s.precision},
                       {"total", s.total}, {"optimizer_buffers", names}, {"shards", shards}};
    write_checkpoint(partial / "manifest.dtckpt", meta, {});
    phase("manifest");
    std::error_code ec;
    fs::remove_all(dir, ec);  // the same step saved again (a resumed run): replaced whole
    fs::rename(partial, dir, ec);
    if (ec) {
      throw Error(fmt::format("{}: cannot rename it to {}: {}", partial.string(), dir.string(),
                              ec.message()),
                  "check the checkpoint directory's permissions");
    }
    sync_directory(dir.parent_path().string());
    phase("renamed");
  }
  comm.barrier();  // visible before any rank goes on (and prunes, or saves again)
}

Checkpoint read_any_checkpoint(const fs::path& path) {
  if (is_sharded_checkpoint(path)) return consolidate(path);
  // One file of a step-N/ directory (a rank's shard, the manifest) holds part of a save.
  if (const fs::path dir = path.parent_path(); !dir.empty() && is_sharded_checkpoint(dir)) {
    throw Error(
        fmt::format("{}: one file of the sharded checkpoint {}", path.string(), dir.string()),
        fmt::format("pass the directory {}: its manifest and every rank's shard are "
                    "read together",
                    dir.string()));
  }
  return read_checkpoint(path);
}

std::vector<std::string> class_names_in(const nlohmann::json& names, const std::string& where) {
  bool ok = names.is_array() && !names.empty();
  for (const nlohmann::json& n : names) ok = ok && n.is_string();
  if (!ok) {
    throw Error(fmt::format("{}: its class names {} are not a list of names", where,
                            names.dump().substr(0, 200)),
                "the file is damaged or not dtrain's: use another checkpoint or export");
  }
  return names.get<std::vector<std::string>>();
}

std::string class_mismatch(const std::vector<std::string>& then,
                           const std::vector<std::string>& now) {
  if (then.empty() || now.empty() || then == now) return {};
  size_t k = 0;
  while (k < then.size() && k < now.size() && then[k] == now[k]) ++k;
  const auto name = [](const std::vector<std::string>& v, size_t i) {
    return i < v.size() ? fmt::format("\"{}\"", v[i]) : std::string("none");
  };
  return fmt::format(
      "the model was trained on {} classes, data.path's training split has {}: "
      "class {} is {} in the checkpoint, {} in the folder",
      then.size(), now.size(), k, name(then, k), name(now, k));
}

namespace {

TrainCounters counters_of(const Checkpoint& ck) {
  const fs::path& file = ck.file;
  TrainCounters c;
  c.step = ck.meta.at("step");
  c.position = {ck.meta.at("data_position").at("epoch"), ck.meta.at("data_position").at("offset")};
  c.seed = ck.meta.at("seed");
  c.arch = ck.meta.at("arch");
  c.config_hash = ck.meta.at("config_hash");
  if (const auto it = ck.meta.find("job_yaml"); it != ck.meta.end() && it->is_string())
    c.job_yaml = it->get<std::string>();
  if (ck.meta.contains("model")) c.heads = ck.meta.at("model").value("heads", int64_t{0});
  if (ck.meta.contains("classes")) c.classes = class_names_in(ck.meta.at("classes"), file.string());
  if (ck.meta.contains("frozen_steps")) {
    const nlohmann::json& f = ck.meta.at("frozen_steps");
    bool ok = f.is_object();
    for (auto it = f.begin(); ok && it != f.end(); ++it) {
      ok = it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
           it.value().get<int64_t>() <= c.step;
      if (ok) c.frozen_steps[it.key()] = it.value().get<int64_t>();
    }
    if (!ok) {
      throw Error(fmt::format("{}: frozen_steps is not a map of tensor names to step counts up to "
                              "the checkpoint's step {}",
                              file.string(), c.step),
                  "the checkpoint's header is damaged: resume from another checkpoint");
    }
  }
  if (ck.meta.contains("allreduce_auto")) {
    const nlohmann::json& a = ck.meta.at("allreduce_auto");
    TrainCounters::AutoAllreduce choice;
    bool ok = a.is_object() && a.contains("world") && a.at("world").is_number_integer() &&
              a.at("world").get<int64_t>() > 1 && a.at("world").get<int64_t>() <= INT32_MAX &&
              a.contains("classes") && a.at("classes").is_array() && a.contains("backend") &&
              a.at("backend").is_string() && a.contains("buckets") && a.at("buckets").is_array();
    if (ok) {
      choice.world = a.at("world").get<int>();
      choice.backend = a.at("backend").get<std::string>();
      for (const nlohmann::json& b : a.at("buckets")) {
        ok = ok && b.is_number_integer() && b.get<int64_t>() > 0;
        if (ok) choice.buckets.push_back(b.get<int64_t>());
      }
    }
    if (ok && a.contains("grid")) {  // a pipeline or tensor grid's: its degrees and signature
      ok = a.at("grid").is_array() && a.at("grid").size() == 3 && a.contains("signature") &&
           a.at("signature").is_string() && a.at("signature").get<std::string>().size() == 16;
      for (size_t i = 0; ok && i < 3; ++i) {
        const nlohmann::json& d = a.at("grid")[i];
        ok = d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= INT32_MAX;
        if (ok) choice.grid.push_back(d.get<int>());
      }
      if (ok) {
        const std::string sig = a.at("signature").get<std::string>();
        ok = sig.find_first_not_of("0123456789abcdef") == std::string::npos;
        if (ok) choice.signature = std::stoull(sig, nullptr, 16);
      }
    }
    for (size_t i = 0; ok && i < a.at("classes").size(); ++i) {
      const nlohmann::json& e = a.at("classes")[i];
      ok = e.is_object() && e.contains("bytes") && e.at("bytes").is_number_integer() &&
           e.at("bytes").get<int64_t>() > 0 && e.contains("algo") && e.at("algo").is_string();
      if (!ok) break;
      const std::string algo = e.at("algo").get<std::string>();
      ok = algo == "native" || algo == "ring" || algo == "hierarchical";
      choice.classes.emplace_back(e.at("bytes").get<int64_t>(), algo);
    }
    if (!ok) {
      throw Error(fmt::format("{}: allreduce_auto is not a world size, a backend, bucket sizes "
                              "and a list of (bytes, algorithm) classes (and a grid's degrees "
                              "and signature)",
                              file.string()),
                  "the checkpoint's header is damaged: resume from another checkpoint");
    }
    c.allreduce_auto = choice;
  }
  if (ck.meta.contains("eval_pending")) {
    const nlohmann::json& e = ck.meta.at("eval_pending");
    if (!e.is_boolean()) {
      throw Error(fmt::format("{}: eval_pending is not true or false", file.string()),
                  "the checkpoint's header is damaged: resume from another checkpoint");
    }
    c.eval_pending = e.get<bool>();
  }
  if (ck.meta.contains("log_window")) {
    const nlohmann::json& w = ck.meta.at("log_window");
    c.window_loss_sum = std::bit_cast<double>(w.at("loss_sum_bits").get<uint64_t>());
    c.window_losses = w.at("losses");
    if (w.contains("last_loss_bits"))
      c.last_loss = std::bit_cast<double>(w.at("last_loss_bits").get<uint64_t>());
  }
  if (ck.meta.contains("best_eval")) {
    const nlohmann::json& j = ck.meta.at("best_eval");
    BestEval b;
    b.metric = j.at("metric");
    b.step = j.at("step");
    b.loss = std::bit_cast<double>(j.at("loss_bits").get<uint64_t>());
    b.accuracy = std::bit_cast<double>(j.at("accuracy_bits").get<uint64_t>());
    b.reference = std::bit_cast<double>(j.at("reference_bits").get<uint64_t>());
    b.stale_evals = j.at("stale_evals");
    b.stopped = j.at("stopped_early");
    b.weights = j.value("weights", std::string("model"));
    if (b.step < 0 || b.step > c.step || b.stale_evals < 0 ||
        (b.weights != "model" && b.weights != "ema")) {
      throw Error(
          fmt::format("{}: best_eval out of range (step {}, {} evaluations since a "
                      "gain, of weights \"{}\")",
                      file.string(), b.step, b.stale_evals, b.weights));
    }
    c.best = b;
  }
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
}

// The optimizer state buffers a checkpoint holds against this run's: the same, but for
// optimizer.ema's average, which either may hold alone.
void check_state_names(const fs::path& path, std::vector<std::string> saved,
                       std::vector<std::string> live) {
  for (std::vector<std::string>* names : {&saved, &live}) {
    names->erase(std::remove(names->begin(), names->end(), optim::kEmaBuffer), names->end());
    std::sort(names->begin(), names->end());
  }
  if (saved == live) return;
  const auto list = [](const std::vector<std::string>& names) {
    return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
  };
  throw Error(fmt::format("{}: its optimizer state buffers ({}) differ from this run's ({}); "
                          "only optimizer.ema's average may come or go at a resume",
                          path.string(), list(saved), list(live)),
              "resume with the optimizer settings the run was written with (a momentum of 0 "
              "keeps no momentum buffer)");
}

void check_optimizer(const Checkpoint& ck, const optim::Optimizer& opt) {
  const std::string opt_name = ck.meta.at("optimizer").at("name");
  if (opt_name != to_string(opt.name())) {
    throw Error(fmt::format("{}: written with optimizer {}, this job uses {}", ck.file.string(),
                            opt_name, to_string(opt.name())),
                "resume with the optimizer the run started with");
  }
}

}  // namespace

TrainCounters load_train_state_ranges(const fs::path& path, const RangeLoad& l) {
  optim::Optimizer& opt = *l.opt;
  const optim::OptimizerState live = opt.state();  // views of the live [begin, end) buffers
  DTRAIN_CHECK(l.state || opt.total_elems() == l.end - l.begin,
               "an optimizer of {} elements for [{}, {})", opt.total_elems(), l.begin, l.end);
  const graph::FlatStore layout(*l.layout);
  const int64_t total = layout.buffer_elems(DType::f32);
  // The buffers of a checkpoint (rank 0's shard, or the file) checked against ours.
  auto check_buffers = [&](const CheckpointReader& rd) {
    for (DType dt : kStoreTypes) {
      const Tensor mine = l.buffers->flat(dt);
      if (mine.defined()) check_same(rd, "buffers." + std::string(dtype_name(dt)), mine);
    }
  };
  auto load_buffers = [&](const CheckpointReader& rd) {  // batch-norm statistics: small
    for (DType dt : kStoreTypes) {
      const Tensor mine = l.buffers->flat(dt);
      if (mine.defined()) copy_into(rd.read("buffers." + std::string(dtype_name(dt))), mine);
    }
  };
  // optimizer.ema's average may be in the checkpoint and not in this run, or the other
  // way round: the other buffers load, an average the run lacks is not read, and one the
  // checkpoint lacks starts again from the weights (TrainCounters::ema says which).
  std::vector<std::string> saved_names;  // the checkpoint's, set below
  const auto saved = [&](const std::string& name) {
    return std::find(saved_names.begin(), saved_names.end(), name) != saved_names.end();
  };
  std::vector<std::string> live_names;
  for (const auto& [name, t] : live.buffers) live_names.push_back(name);
  // The parameters, then every state buffer (the blobs "optim.<name>"), of a blob
  // holding elements [first, ...) of the layout, a piece at a time: the parameters
  // whole, the state's part in [begin, end).
  auto load_pieces = [&](const CheckpointReader& rd, const std::string& params, int64_t first,
                         bool state) {
    rd.pieces(params, kLoadPiece,
              [&](int64_t lo, const Tensor& piece) { l.params(first + lo, piece); });
    if (!state) return;
    for (size_t i = 0; i < live.buffers.size(); ++i) {
      const std::string& name = live.buffers[i].first;
      if (!saved(name)) continue;
      rd.pieces("optim." + name, kLoadPiece, [&](int64_t lo, const Tensor& piece) {
        lo += first;
        if (l.state) {
          l.state(name, lo, piece);
          return;
        }
        const int64_t a = std::max(lo, l.begin), b = std::min(lo + piece.numel(), l.end);
        if (a < b) opt.load_state_piece(i, a - l.begin, piece.view(a - lo, Shape{b - a}));
      });
    }
  };
  try {
    if (!is_sharded_checkpoint(path)) {
      const CheckpointReader rd(path);  // every checksum verified here, no blob held
      const Checkpoint ck = rd.header();
      if (ck.meta.at("format") != "dtrain-train-state") {
        throw Error(fmt::format("{}: not a training checkpoint", path.string()),
                    "a sharded checkpoint is resumed from its step-N/ directory, not from one "
                    "of its files");
      }
      check_layout(ck, "params", layout_of(*l.layout));
      check_layout(ck, "buffers", layout_of(*l.buffers));
      check_optimizer(ck, opt);
      auto check_whole = [&](const std::string& name) {
        const CheckpointReader::Blob& saved = rd.blob(name);
        if (saved.dtype != DType::f32 || saved.shape.numel() != total) {
          throw Error(fmt::format("{}: tensor \"{}\" is {}, this run needs f32 [{}]", path.string(),
                                  name, blob_str(saved), total),
                      "the checkpoint was written by a different model or optimizer "
                      "configuration");
        }
      };
      check_whole("params.f32");
      for (const CheckpointReader::Blob& b : rd.blobs())
        if (b.name.rfind("optim.", 0) == 0) saved_names.push_back(b.name.substr(6));
      check_state_names(path, saved_names, live_names);
      for (const auto& [name, t] : live.buffers)
        if (saved(name)) check_whole("optim." + name);  // all but an average, checked above
      check_buffers(rd);
      load_pieces(rd, "params.f32", 0, true);
      load_buffers(rd);
      optim::OptimizerState st = opt.state();
      st.step = ck.meta.at("optimizer").at("step");
      opt.load_state(st);
      opt.set_ema_ready(saved(optim::kEmaBuffer));
      if (l.extra) {
        std::vector<NamedTensor> extras;
        for (const CheckpointReader::Blob& b : rd.blobs())
          if (is_extra_blob(b.name)) extras.push_back({b.name, rd.read_blob(b)});
        std::vector<const NamedTensor*> blobs;
        for (const NamedTensor& t : extras) blobs.push_back(&t);
        l.extra(blobs);
      }
      TrainCounters c = counters_of(ck);
      c.ema = saved(optim::kEmaBuffer);
      return c;
    }
    const fs::path manifest = path / "manifest.dtckpt";
    const Checkpoint man = read_checkpoint(manifest);                // its own checksums
    const std::vector<ShardRef> shards = checked_shards(path, man);  // every file's CRC
    check_layout(man, "params", layout_of(*l.layout));
    check_layout(man, "buffers", layout_of(*l.buffers));
    check_optimizer(man, opt);
    saved_names = man.meta.at("sharded").at("optimizer_buffers").get<std::vector<std::string>>();
    check_state_names(path, saved_names, live_names);
    std::vector<std::string> names;  // this run's buffers that the checkpoint has
    for (const std::string& name : live_names)
      if (saved(name)) names.push_back(name);
    if (man.meta.at("sharded").at("total").get<int64_t>() != total)
      bad_shard(manifest, "its layout size differs from this run's");
    // Every shard's blobs are checked before any is loaded, so that a shard of the
    // wrong size leaves the live state as it was; one shard file is open at a time (a
    // save of thousands of ranks stays within the open-file limit).
    for (const ShardRef& r : shards) {
      const CheckpointReader rd = open_shard(r, man);
      range_blob(rd, r, "params");
      for (const std::string& name : names) range_blob(rd, r, "optim." + name);
      if (r.rank == 0) check_buffers(rd);
    }
    for (const ShardRef& r : shards) {
      const CheckpointReader rd = open_shard(r, man);
      // The state of a shard outside [begin, end) is not read (tensor parallelism's
      // `state` takes every range).
      load_pieces(rd, "params", r.begin, l.state || (r.begin < l.end && l.begin < r.end));
      if (r.rank == 0) load_buffers(rd);
    }
    optim::OptimizerState st = opt.state();
    st.step = man.meta.at("optimizer").at("step");
    opt.load_state(st);
    opt.set_ema_ready(saved(optim::kEmaBuffer));
    // Extra blobs (compression's state) are per rank: only a checkpoint of this world
    // size has this rank's.
    if (static_cast<int>(shards.size()) == l.world && l.extra) {
      // This rank's shard's extra blobs, then those of rank 0's it lacks.
      std::vector<NamedTensor> extras;
      for (const int from : l.rank == 0 ? std::vector<int>{0} : std::vector<int>{l.rank, 0}) {
        const CheckpointReader rd = open_shard(shards[static_cast<size_t>(from)], man);
        for (const CheckpointReader::Blob& b : rd.blobs()) {
          if (is_extra_blob(b.name) &&
              std::none_of(extras.begin(), extras.end(),
                           [&](const NamedTensor& t) { return t.name == b.name; }))
            extras.push_back({b.name, rd.read_blob(b)});
        }
      }
      std::vector<const NamedTensor*> blobs;
      for (const NamedTensor& t : extras) blobs.push_back(&t);
      l.extra(blobs);
    }
    TrainCounters c = counters_of(man);
    c.ema = saved(optim::kEmaBuffer);
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed training metadata: {}", path.string(), e.what()),
                "the file passed its checksums but was not written by dtrain train");
  }
}

fs::path resolve_resume(const std::string& resume, const fs::path& checkpoint_dir,
                        std::string_view option) {
  if (resume == "best") {
    const std::optional<int64_t> step = best_record_step(checkpoint_dir);
    if (!step) {
      throw Error(fmt::format("{} best: no best checkpoint recorded in {} (no {})", option,
                              checkpoint_dir.string(), kBestRecordName),
                  "dtrain train keeps one with train.best.metric loss (or accuracy), "
                  "train.eval_every and train.best.keep_checkpoint true; or pass latest or a "
                  "checkpoint's path");
    }
    for (const fs::path& p : list_checkpoints(checkpoint_dir))
      if (step_of_name(p) == step) return p;
    throw Error(
        fmt::format("{} best: {} names step {}, and {} holds no checkpoint of that step", option,
                    (checkpoint_dir / kBestRecordName).string(), *step, checkpoint_dir.string()),
        "pass latest or a checkpoint's path");
  }
  fs::path dir = resume == "latest" ? checkpoint_dir : fs::path(resume);
  if (resume != "latest" && (fs::is_regular_file(dir) || is_sharded_checkpoint(dir))) return dir;
  if (resume == "latest" && !fs::exists(dir)) return {};
  if (!fs::is_directory(dir)) {
    throw Error(fmt::format("{} {}: no such checkpoint file or directory", option, resume),
                "pass latest, a .dtckpt file or a checkpoint directory");
  }
  auto all = list_checkpoints(dir);
  // A run directory stands for its checkpoints/ (as for dtrain ckpt).
  if (all.empty() && resume != "latest" && fs::is_directory(dir / "checkpoints"))
    all = list_checkpoints(dir / "checkpoints");
  if (all.empty() && resume == "latest") return {};  // nothing saved yet: start afresh
  if (all.empty()) {
    throw Error(
        fmt::format("{} {}: no checkpoint (step-N.dtckpt or step-N/) in {}", option, resume,
                    dir.string()),
        fmt::format("pass a run's directory or its checkpoints/, a step-N.dtckpt file or "
                    "a step-N/ directory{}",
                    option == "--resume" ? "; or train without --resume to start afresh" : ""));
  }
  return all.back();
}

namespace {

// A resolved job's settings as "section.key" -> value text, in file order. The dump
// nests mappings by two spaces and writes lists in flow style; a line of any other
// shape continues the value before it.
std::vector<std::pair<std::string, std::string>> flat_settings(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> path;  // the open mappings' keys, by depth
  std::istringstream in(yaml);
  for (std::string line; std::getline(in, line);) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    const std::string body = line.substr(indent);
    const size_t colon = body.find(": ") != std::string::npos ? body.find(": ")
                         : body.back() == ':'                 ? body.size() - 1
                                                              : std::string::npos;
    const size_t depth = indent / 2;
    if (colon == std::string::npos || body[0] == '-' || depth > path.size()) {
      if (!out.empty()) out.back().second += (out.back().second.empty() ? "" : " ") + body;
      continue;
    }
    path.resize(depth);
    std::string key;
    for (const std::string& k : path) key += k + ".";
    key += body.substr(0, colon);
    const std::string value = colon + 1 < body.size() ? body.substr(colon + 2) : std::string();
    if (value.empty()) path.push_back(body.substr(0, colon));
    out.emplace_back(key, value);
  }
  return out;
}

}  // namespace

std::string changed_settings(const std::string& before, const std::string& after, size_t shown) {
  const auto old_list = flat_settings(before), new_list = flat_settings(after);
  const std::map<std::string, std::string> old_map(old_list.begin(), old_list.end());
  const std::map<std::string, std::string> new_map(new_list.begin(), new_list.end());
  std::vector<std::string> changes;
  // A value as the job wrote it, a long one (a prompt, parameter groups) cut to 48 bytes.
  const auto text = [](const std::string& v) {
    if (v.empty()) return std::string("{}");
    return v.size() > 48 ? v.substr(0, 45) + "..." : v;
  };
  for (const auto& [key, value] : new_list) {
    const auto it = old_map.find(key);
    if (it == old_map.end())
      changes.push_back(fmt::format("{} (not in the checkpoint's) -> {}", key, text(value)));
    else if (it->second != value)
      changes.push_back(fmt::format("{} {} -> {}", key, text(it->second), text(value)));
  }
  for (const auto& [key, value] : old_list) {
    if (new_map.count(key) == 0)
      changes.push_back(fmt::format("{} {} -> (not in this run's)", key, text(value)));
  }
  std::string out;
  for (size_t i = 0; i < changes.size() && i < shown; ++i) out += (i ? ", " : "") + changes[i];
  if (changes.size() > shown) out += fmt::format(" and {} more", changes.size() - shown);
  return out;
}

}  // namespace dtrain::runtime
