// safetensors reading and writing, the checkpoint export and model.init_from's import.
// The header is ordered (tensors in the order of their data); the data of each tensor
// follows the previous one with no gap, as the format's own loader requires.
#include "runtime/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/atomic_file.h"
#include "optim/optimizer.h"
#include "runtime/export_names.h"

namespace dtrain::runtime {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // the format's own limit

constexpr std::pair<DType, std::string_view> kDTypes[] = {
    {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"}, {DType::f64, "F64"},
    {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u8, "U8"}};

std::string_view st_dtype(DType dt) {
  for (const auto& [d, name] : kDTypes)
    if (d == dt) return name;
  DTRAIN_CHECK(false, "no safetensors dtype for {}", dtype_name(dt));
  return {};
}

[[noreturn]] void bad_file(const fs::path& file, const std::string& what) {
  throw Error(fmt::format("{}: {}", file.string(), what),
              "the file is damaged, truncated, or not a safetensors file");
}

// `file` opened for reading, refusing a directory, an unreadable file and a dtrain
// checkpoint (its magic) with what to do instead.
std::ifstream open_file(const fs::path& file) {
  std::error_code ec;
  if (fs::is_directory(file, ec)) {
    throw Error(fmt::format("{}: is a directory, not a safetensors file", file.string()),
                "for a run directory or checkpoint, write its weights first: `dtrain ckpt "
                "export " +
                    file.string() + " --safetensors FILE.safetensors`");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error(fmt::format("{}: cannot read it", file.string()),
                "check the path (a .safetensors file) and its permissions");
  }
  char magic[8] = {};
  in.read(magic, sizeof(magic));
  if (in.gcount() == 8 && std::string_view(magic, 8) == "DTRAINCK") {  // checkpoint.cpp's
    throw Error(fmt::format("{}: is a dtrain checkpoint, not a safetensors file", file.string()),
                "write its weights first: `dtrain ckpt export " + file.string() +
                    " --safetensors FILE.safetensors`");
  }
  in.clear();
  in.seekg(0);
  return in;
}

using Span = SafetensorsEntry;

Span parse_entry(const fs::path& file, const std::string& name, const nlohmann::json& e) {
  const std::string dt = e.at("dtype").get<std::string>();
  const auto* found = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                   [&](const auto& p) { return p.second == dt; });
  if (found == std::end(kDTypes)) {
    bad_file(file, fmt::format("tensor {} has dtype {}; dtrain reads F32, F16, BF16, F64, I64, "
                               "I32 and U8",
                               name, dt));
  }
  const auto dims = e.at("shape").get<std::vector<int64_t>>();
  if (dims.size() > static_cast<size_t>(Shape::kMaxDims) ||
      std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d < 0; })) {
    bad_file(file, fmt::format("tensor {} has shape {}", name, e.at("shape").dump()));
  }
  const auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();
  if (offsets.size() != 2)
    bad_file(file, fmt::format("tensor {}: data_offsets is not [b, e]", name));
  Span s{name, found->first, Shape(dims.begin(), dims.end()), offsets[0], offsets[1]};
  const auto bytes = static_cast<uint64_t>(s.shape.numel()) * dtype_size(s.dtype);
  if (s.end < s.begin || s.end - s.begin != bytes) {
    bad_file(file, fmt::format("tensor {} {} needs {} bytes, its data_offsets [{}, {}] hold {}",
                               name, s.shape.str(), bytes, s.begin, s.end,
                               s.end >= s.begin ? s.end - s.begin : 0));
  }
  return s;
}

// The tensors' spans, sorted by offset, checked to cover [0, data_bytes) with no gap.
std::vector<Span> parse_header(const fs::path& file, const nlohmann::json& header,
                               uint64_t data_bytes, std::map<std::string, std::string>& meta) {
  if (!header.is_object()) bad_file(file, "the header is not a JSON object");
  std::vector<Span> spans;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : e.items())
        meta[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    spans.push_back(parse_entry(file, name, e));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  for (const Span& s : spans) {
    if (s.begin != at) {
      bad_file(file, fmt::format("tensor {} starts at data byte {}, expected {} (a gap or an "
                                 "overlap)",
                                 s.name, s.begin, at));
    }
    at = s.end;
  }
  if (at != data_bytes) {
    bad_file(file, fmt::format("the tensors hold {} data bytes, the file has {}", at, data_bytes));
  }
  return spans;
}

Tensor widen(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  float* dst = out.data<float>();
  const int64_t n = t.numel();
  if (t.dtype() == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(t.data<bf16>()[i]);
  } else {
    DTRAIN_CHECK(t.dtype() == DType::f16, "widen {}", t.str());
    for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(t.data<f16>()[i]);
  }
  return out;
}

Tensor narrow(const Tensor& t, DType dt) {
  if (dt == DType::f32) return t;
  Tensor out = Tensor::empty(t.shape(), dt);
  const float* src = t.data<float>();
  const int64_t n = t.numel();
  if (dt == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) out.data<bf16>()[i] = to_bf16(src[i]);
  } else {
    DTRAIN_CHECK(dt == DType::f16, "narrow to {}", dtype_name(dt));
    for (int64_t i = 0; i < n; ++i) out.data<f16>()[i] = to_f16(src[i]);
  }
  return out;
}

std::vector<graph::FlatEntry> as_f32(std::vector<graph::FlatEntry> entries) {
  for (graph::FlatEntry& e : entries) e.spec.dtype = DType::f32;
  return graph::FlatStore(std::move(entries)).entries();
}

// Entry `e` of the store "<prefix>.<dtype>" of a checkpoint, as f32 in its own shape.
Tensor entry_of(const Checkpoint& ck, const std::string& prefix, const graph::FlatEntry& e) {
  const Tensor& flat = ck.get(prefix + "." + std::string(dtype_name(e.spec.dtype)));
  if (e.offset + e.spec.shape.numel() > flat.numel()) {
    throw Error(
        fmt::format("{}: tensor {} lies past the end of {}.{} ({} elements)", ck.file.string(),
                    e.name, prefix, dtype_name(e.spec.dtype), flat.numel()),
        "the checkpoint's layout and its tensors disagree");
  }
  const Tensor v = flat.view(e.offset, e.spec.shape);
  if (v.dtype() == DType::f32) {
    Tensor copy = Tensor::empty(v.shape(), DType::f32);
    std::memcpy(copy.raw(), v.raw(), v.nbytes());
    return copy;
  }
  return widen(v);
}

struct Layouts {
  std::string arch;
  std::vector<graph::FlatEntry> params, buffers;
};

Layouts layouts_of(const Checkpoint& ck) {
  try {
    return {ck.meta.at("arch").get<std::string>(), layout_from_meta(ck.meta.at("params")),
            layout_from_meta(ck.meta.value("buffers", nlohmann::json::array()))};
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed training metadata: {}", ck.file.string(), e.what()),
                "the file passed its checksums but was not written by dtrain train");
  }
}

[[noreturn]] void init_error(const fs::path& file, const std::string& what,
                             const std::string& hint) {
  throw Error(fmt::format("{}: {}", file.string(), what), hint);
}

}  // namespace

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return &t.tensor;
  return nullptr;
}

SafetensorsReader::SafetensorsReader(const fs::path& file) : file_(file), in_(open_file(file)) {
  // The size of what was opened (not the path looked up again); a stream that cannot
  // seek (a pipe) reads as empty.
  in_.seekg(0, std::ios::end);
  const std::streamoff end = in_.tellg();
  const uint64_t size = end > 0 ? static_cast<uint64_t>(end) : 0;
  in_.clear();
  in_.seekg(0);
  if (size < 8) bad_file(file, fmt::format("{} bytes, too short for a header", size));
  uint64_t n = 0;
  in_.read(reinterpret_cast<char*>(&n), 8);  // little-endian hosts only (x86-64, aarch64)
  if (!in_ || n > kMaxHeader || n > size - 8) {
    bad_file(file, fmt::format("the header claims {} bytes; the file has {} after the length", n,
                               size - 8));
  }
  std::string header(static_cast<size_t>(n), '\0');
  in_.read(header.data(), static_cast<std::streamsize>(n));
  if (!in_) bad_file(file, "the header could not be read");
  try {
    entries_ = parse_header(file, nlohmann::json::parse(header), size - 8 - n, metadata_);
  } catch (const nlohmann::json::exception& e) {
    bad_file(file, fmt::format("malformed header: {}", e.what()));
  }
  data_at_ = 8 + n;
}

Tensor SafetensorsReader::read(size_t i) {
  const SafetensorsEntry& e = entries_.at(i);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  in_.clear();  // a failed read before does not fail this one
  in_.seekg(static_cast<std::streamoff>(data_at_ + e.begin));
  in_.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(e.end - e.begin));
  if (!in_) bad_file(file_, fmt::format("tensor {}: its bytes could not be read", e.name));
  return t;
}

SafetensorsFile read_safetensors(const fs::path& file) {
  SafetensorsReader reader(file);
  SafetensorsFile out;
  out.file = file;
  out.metadata = reader.metadata();
  for (size_t i = 0; i < reader.entries().size(); ++i)
    out.tensors.push_back({reader.entries()[i].name, reader.read(i)});
  return out;
}

void write_safetensors(const fs::path& file, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  std::vector<std::string_view> parts = {{}, {}};  // length and header, filled below
  for (const NamedTensor& t : tensors) {
    DTRAIN_CHECK(t.tensor.device().is_cpu(), "write_safetensors: {} is on {}", t.name,
                 t.tensor.device().str());
    header[t.name] = {
        {"dtype", st_dtype(t.tensor.dtype())},
        {"shape", std::vector<int64_t>(t.tensor.shape().begin(), t.tensor.shape().end())},
        {"data_offsets", {at, at + t.tensor.nbytes()}}};
    at += t.tensor.nbytes();
    parts.emplace_back(static_cast<const char*>(t.tensor.raw()), t.tensor.nbytes());
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  char length[8];
  std::memcpy(length, &n, 8);
  parts[0] = std::string_view(length, 8);
  parts[1] = text;
  write_file_atomic(file.string(), parts);
}

std::vector<NamedTensor> checkpoint_model_tensors(const Checkpoint& ck) {
  const Layouts l = layouts_of(ck);
  std::vector<NamedTensor> out;
  for (const graph::FlatEntry& e : l.params) out.push_back({e.name, entry_of(ck, "params", e)});
  for (const graph::FlatEntry& e : l.buffers) out.push_back({e.name, entry_of(ck, "buffers", e)});
  return out;
}

bool holds_average(const Checkpoint& ck) {
  const std::string average = std::string("optim.") + optim::kEmaBuffer;
  return std::any_of(ck.tensors.begin(), ck.tensors.end(),
                     [&](const NamedTensor& t) { return t.name == average; });
}

std::string select_weights(Checkpoint& ck, std::string_view choice) {
  if (choice != "auto" && choice != "model" && choice != "ema") {
    throw Error(fmt::format("--weights {}: expected auto, model or ema", choice));
  }
  const std::string average = std::string("optim.") + optim::kEmaBuffer;
  const auto find = [&](const std::string& name) {
    return std::find_if(ck.tensors.begin(), ck.tensors.end(),
                        [&](const NamedTensor& t) { return t.name == name; });
  };
  const auto ema = find(average);
  if (choice == "model" || (choice == "auto" && ema == ck.tensors.end())) return "model";
  if (ema == ck.tensors.end()) {
    throw Error(fmt::format("{}: holds no average of the weights (its run did not set "
                            "optimizer.ema.decay)",
                            ck.file.string()),
                "leave --weights out (or pass --weights model) for the weights it holds");
  }
  const auto params = find("params.f32");
  if (params == ck.tensors.end() || !(params->tensor.shape() == ema->tensor.shape())) {
    throw Error(fmt::format("{}: its average ({}) and its parameters do not match",
                            ck.file.string(), ema->tensor.str()),
                "the checkpoint was not written by dtrain train");
  }
  params->tensor = ema->tensor;
  return "ema";
}

ExportSummary export_safetensors(const Checkpoint& ck, const fs::path& out, DType dtype, bool ema) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
    throw Error(fmt::format("--dtype {}: expected f32, bf16 or f16", dtype_name(dtype)));
  }
  const Layouts l = layouts_of(ck);
  const std::vector<NamedTensor> ours = checkpoint_model_tensors(ck);
  const std::vector<ExportTensor> plan = export_plan(family_of(l.arch), l.params, l.buffers);
  ExportSummary s;
  s.arch = l.arch;
  std::vector<NamedTensor> tensors;
  for (const ExportTensor& t : plan) {
    const size_t index = static_cast<size_t>(t.entry) +
                         (t.store == StoreKind::buffers ? l.params.size() : size_t{0});
    tensors.push_back({t.name, narrow(to_reference(t, ours[index].tensor), dtype)});
    s.elements += t.shape.numel();
  }
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"source", "dtrain"},
      {"arch", l.arch},
      {"step", std::to_string(ck.meta.value("step", int64_t{0}))},
      {"weights", ema ? "ema" : "model"}};
  if (ck.meta.contains("model") && ck.meta.at("model").contains("heads"))
    meta["heads"] = std::to_string(ck.meta.at("model").at("heads").get<int64_t>());
  if (ck.meta.contains("classes")) meta["classes"] = ck.meta.at("classes").dump();
  write_safetensors(out, tensors, meta);
  s.tensors = static_cast<int64_t>(tensors.size());
  s.bytes = static_cast<int64_t>(fs::file_size(out));
  return s;
}

InitWeights load_init_weights(const fs::path& file, std::string_view arch,
                              const std::vector<graph::FlatEntry>& params,
                              const std::vector<graph::FlatEntry>& buffers, const InitTake& take) {
  const ModelFamily family = family_of(arch);
  const std::vector<graph::FlatEntry> p32 = as_f32(params), b32 = as_f32(buffers);
  const std::vector<ExportTensor> plan = export_plan(family, p32, b32);
  // One tensor at a time: the file is never held whole (runtime::estimate_memory counts
  // the largest tensor, its f32 widening and the f32 layout below).
  SafetensorsReader st(file);
  std::map<std::string, const ExportTensor*> wanted;
  for (const ExportTensor& t : plan) wanted[t.name] = &t;
  const std::string hint = fmt::format(
      "model.init_from needs the tensors `dtrain ckpt export --safetensors` writes for a model "
      "of this shape ({}: {} tensors, e.g. {}); check model.arch and its size keys",
      arch, plan.size(), plan.empty() ? "" : plan.front().name);

  InitWeights out;
  out.metadata = st.metadata();
  if (!take) {
    out.params = Tensor::empty({graph::FlatStore(p32).buffer_elems(DType::f32)}, DType::f32);
    std::memset(out.params.raw(), 0, out.params.nbytes());
  }
  if (!b32.empty()) {
    out.buffers = Tensor::empty({graph::FlatStore(b32).buffer_elems(DType::f32)}, DType::f32);
    std::memset(out.buffers.raw(), 0, out.buffers.nbytes());
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < st.entries().size(); ++i) {
    const SafetensorsEntry& t = st.entries()[i];
    const std::string name = canonical_import_name(family, t.name);
    if (ignored_on_import(family, t.name) || ignored_on_import(family, name)) continue;
    const auto it = wanted.find(name);
    const bool head = is_head_tensor(family, name);
    if (head && (it == wanted.end() || !(t.shape == it->second->shape))) {
      out.unused.push_back(t.name);  // another task's head, or another class count
      continue;
    }
    if (it == wanted.end()) {
      init_error(file, fmt::format("tensor {} is not part of this model ({})", t.name, arch), hint);
    }
    if (!seen.insert(name).second) {
      init_error(file, fmt::format("tensor {} appears twice", name), hint);
    }
    const ExportTensor& x = *it->second;
    if (!(t.shape == x.shape)) {
      init_error(file,
                 fmt::format("tensor {} has shape {}, this model needs {}", t.name, t.shape.str(),
                             x.shape.str()),
                 hint);
    }
    const DType dt = t.dtype;
    if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16) {
      init_error(file,
                 fmt::format("tensor {} is {}; model.init_from reads F32, BF16 and F16", t.name,
                             st_dtype(dt)),
                 "export it again in one of those dtypes");
    }
    const bool is_param = x.store == StoreKind::params;
    const graph::FlatEntry& e = (is_param ? p32 : b32)[static_cast<size_t>(x.entry)];
    const Tensor wide = widen(st.read(i));
    const float* v = wide.data<float>();
    const float* bad = std::find_if(v, v + wide.numel(), [](float f) { return !std::isfinite(f); });
    if (bad != v + wide.numel()) {
      init_error(file, fmt::format("tensor {} holds {} at element {}", t.name, *bad, bad - v),
                 "a training run would start from it and diverge at once: export the "
                 "weights of an earlier checkpoint, or check how the file was written");
    }
    if (is_param && take) {  // its rows of the parameter, in layout order, handed on
      const int64_t rows = e.spec.shape.rank() == 0 ? 1 : e.spec.shape[0];
      const int64_t cols = e.spec.shape.numel() / rows;
      ExportTensor part = x;
      part.row_begin = 0;
      Tensor these = Tensor::empty(Shape{x.rows, cols}, DType::f32);
      from_reference(part, wide, these);
      take(e.offset + x.row_begin * cols, these.view(0, Shape{x.rows * cols}));
    } else {
      Tensor dst = (is_param ? out.params : out.buffers).view(e.offset, e.spec.shape);
      from_reference(x, wide, dst);
    }
    ++out.tensors;
  }
  std::vector<bool> fresh(p32.size(), false);
  for (const ExportTensor& t : plan) {
    if (seen.contains(t.name)) continue;
    if (t.store == StoreKind::params && is_head_tensor(family, t.name)) {
      out.fresh.push_back(t.name);
      fresh[static_cast<size_t>(t.entry)] = true;
      continue;
    }
    init_error(file, fmt::format("no tensor {} {}, which this model needs", t.name, t.shape.str()),
               hint);
  }
  if (take) return out;
  // The loaded parameter entries as runs of the buffer (a fresh entry splits them).
  const int64_t total = out.params.numel();
  int64_t lo = 0;
  for (size_t i = 0; i < p32.size(); ++i) {
    if (!fresh[i]) continue;
    if (p32[i].offset > lo) out.pieces.emplace_back(lo, p32[i].offset - lo);
    lo = p32[i].offset + p32[i].spec.shape.numel();
  }
  if (lo < total) out.pieces.emplace_back(lo, total - lo);
  return out;
}

}  // namespace dtrain::runtime
