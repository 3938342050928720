// Flat buffers and deterministic initialisation. Each tensor's numbers come
// from Philox keyed by (seed, hash of its name), so adding a layer elsewhere
// never changes how an existing one is initialised.
#include "graph/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/memory.h"

namespace dtrain::graph {

namespace {

constexpr uint32_t kInitPurpose = 1;

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

int64_t align_elems(int64_t n, DType dt) {
  const int64_t per = std::max<int64_t>(1, 64 / static_cast<int64_t>(dtype_size(dt)));
  return (n + per - 1) / per * per;
}

// Value i of entry `e`, before the cast to its dtype.
float init_value(const ParamSpec& s, const Philox& rng, uint64_t i) {
  switch (s.init) {
    case InitKind::zeros:
      return 0.0f;
    case InitKind::ones:
      return 1.0f;
    case InitKind::normal:
      return static_cast<float>(s.scale) * rng.normal(i);
    case InitKind::uniform:
      return static_cast<float>(s.scale) * (2.0f * rng.uniform(i) - 1.0f);
    case InitKind::kaiming_normal:
      return std::sqrt(2.0f / static_cast<float>(s.fan_in)) * rng.normal(i);
    case InitKind::kaiming_uniform:
      return (2.0f * rng.uniform(i) - 1.0f) / std::sqrt(static_cast<float>(s.fan_in));
  }
  return 0.0f;
}

}  // namespace

uint64_t whole_index(const ParamSpec& s, int64_t j) {
  if (!s.split.split()) return static_cast<uint64_t>(j);
  const int d = s.split.dim;
  int64_t inner = 1;
  for (int k = d + 1; k < s.shape.rank(); ++k) inner *= s.shape[k];
  const int64_t extent = s.shape[d], per_chunk = extent / s.split.chunks;
  const int64_t o = j / (extent * inner), l = j / inner % extent, i = j % inner;
  const int64_t g =
      l / per_chunk * (s.split.total / s.split.chunks) + s.split.begin + l % per_chunk;
  return static_cast<uint64_t>((o * s.split.total + g) * inner + i);
}

FlatStore::FlatStore(std::vector<FlatEntry> entries) : entries_(std::move(entries)) {
  for (FlatEntry& e : entries_) {
    auto it = std::find_if(sizes_.begin(), sizes_.end(),
                           [&](const auto& p) { return p.first == e.spec.dtype; });
    if (it == sizes_.end()) it = sizes_.insert(sizes_.end(), {e.spec.dtype, 0});
    e.offset = it->second;
    it->second += align_elems(e.spec.shape.numel(), e.spec.dtype);
  }
}

void FlatStore::allocate(Device device) {
  if (device.is_cpu()) return allocate_host(host_allocator());
  held_.clear();
  buffers_.clear();
  device_ = device;
  for (const auto& [dt, n] : sizes_) {  // zeros made on the host, copied over
    Tensor host = Tensor::empty({n}, dt);
    std::memset(host.raw(), 0, host.nbytes());
    Tensor t = Tensor::empty({n}, dt, &kernels::device_allocator(device));
    kernels::copy(host, t);
    buffers_.emplace_back(dt, std::move(t));
  }
}

void FlatStore::allocate_host(Allocator& host) {
  DTRAIN_CHECK(host.device().is_cpu(), "allocate_host: the allocator is not host memory");
  held_.clear();
  buffers_.clear();
  device_ = Device::cpu();
  for (const auto& [dt, n] : sizes_) {
    Tensor t = Tensor::empty({n}, dt, &host);
    std::memset(t.raw(), 0, t.nbytes());
    buffers_.emplace_back(dt, std::move(t));
  }
}

std::vector<std::pair<DType, std::vector<std::pair<int64_t, int64_t>>>> FlatStore::held_ranges(
    const std::vector<char>& held) const {
  DTRAIN_CHECK(held.size() == entries_.size(), "a held mask of {} for {} entries", held.size(),
               entries_.size());
  std::vector<std::pair<DType, std::vector<std::pair<int64_t, int64_t>>>> out;
  for (const auto& [dt, n] : sizes_)
    out.emplace_back(dt, std::vector<std::pair<int64_t, int64_t>>{});
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (held[i] == 0) continue;
    const FlatEntry& e = entries_[i];
    for (auto& [dt, ranges] : out) {
      if (dt != e.spec.dtype) continue;
      const int64_t end = e.offset + align_elems(e.spec.shape.numel(), dt);
      if (!ranges.empty() && ranges.back().second == e.offset) {
        ranges.back().second = end;
      } else {
        ranges.emplace_back(e.offset, end);
      }
    }
  }
  return out;
}

void FlatStore::allocate_held(const std::vector<char>& held, Unheld rest) {
  const auto ranges = held_ranges(held);
  buffers_.clear();
  device_ = Device::cpu();
  for (size_t b = 0; b < sizes_.size(); ++b) {
    const auto& [dt, n] = sizes_[b];
    buffers_.emplace_back(dt, Tensor::held_pages({n}, dt, ranges[b].second, rest));
  }
  held_ = held;
  rest_ = rest;
}

size_t FlatStore::held_bytes(const std::vector<char>& held) const {
  size_t bytes = 0;
  for (const auto& [dt, ranges] : held_ranges(held)) {
    ByteRanges b;
    for (const auto& [lo, hi] : ranges)
      b.emplace_back(static_cast<size_t>(lo) * dtype_size(dt),
                     static_cast<size_t>(hi) * dtype_size(dt));
    bytes += held_pages_bytes(b);
  }
  return bytes;
}

void FlatStore::initialize(uint64_t seed) {
  // On a device: fill host twins of the buffers (padding stays 0), then copy them over.
  std::vector<std::pair<DType, Tensor>> host;
  for (const auto& [dt, t] : buffers_) {
    if (device_.is_cpu()) {
      host.emplace_back(dt, t);
    } else {
      Tensor h = Tensor::empty(t.shape(), dt);
      std::memset(h.raw(), 0, h.nbytes());
      host.emplace_back(dt, std::move(h));
    }
  }
  for (int i = 0; i < size(); ++i) {
    if (!held(i)) continue;  // another pipeline stage's
    const FlatEntry& e = entries_[static_cast<size_t>(i)];
    const Philox rng(seed, rng_stream_id(kInitPurpose, 0, fnv1a(e.name)));
    Tensor v;
    for (const auto& [dt, t] : host)
      if (dt == e.spec.dtype) v = t.view(e.offset, e.spec.shape);
    DTRAIN_CHECK(v.defined(), "flat store not allocated");
    const int64_t n = v.numel();
    for (int64_t j = 0; j < n; ++j) {
      const float x = init_value(e.spec, rng, whole_index(e.spec, j));
      switch (v.dtype()) {
        case DType::f32:
          v.data<float>()[j] = x;
          break;
        case DType::f16:
          v.data<f16>()[j] = to_f16(x);
          break;
        case DType::bf16:
          v.data<bf16>()[j] = to_bf16(x);
          break;
        default:
          DTRAIN_CHECK(false, "{}: cannot initialise {}", e.name, dtype_name(v.dtype()));
      }
    }
  }
  if (device_.is_cpu()) return;
  for (size_t b = 0; b < buffers_.size(); ++b) kernels::copy(host[b].second, buffers_[b].second);
}

void FlatStore::initialize_range(uint64_t seed, int64_t begin, Tensor& out) const {
  DTRAIN_CHECK(out.dtype() == DType::f32, "initialize_range writes f32, got {}",
               dtype_name(out.dtype()));
  const int64_t end = begin + out.numel();
  Tensor host = out.device().is_cpu() ? out : Tensor::empty(out.shape(), DType::f32);
  std::memset(host.raw(), 0, host.nbytes());
  for (const FlatEntry& e : entries_) {
    DTRAIN_CHECK(e.spec.dtype == DType::f32, "initialize_range: {} is {}", e.name,
                 dtype_name(e.spec.dtype));
    const int64_t lo = std::max(begin, e.offset);
    const int64_t hi = std::min(end, e.offset + e.spec.shape.numel());
    if (lo >= hi) continue;
    const Philox rng(seed, rng_stream_id(kInitPurpose, 0, fnv1a(e.name)));
    float* dst = host.data<float>() + (lo - begin);
    for (int64_t x = lo; x < hi; ++x)
      dst[x - lo] = init_value(e.spec, rng, whole_index(e.spec, x - e.offset));
  }
  if (!out.device().is_cpu()) kernels::copy(host, out);
}

int64_t FlatStore::buffer_elems(DType dtype) const {
  for (const auto& [dt, n] : sizes_) {
    if (dt == dtype) return n;
  }
  return 0;
}

Tensor FlatStore::flat(DType dtype) const {
  for (const auto& [dt, t] : buffers_) {
    if (dt == dtype) return t;
  }
  return Tensor();
}

Tensor FlatStore::view(int index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), "flat entry {} of {}", index, size());
  const FlatEntry& e = entries_[static_cast<size_t>(index)];
  const Tensor buf = flat(e.spec.dtype);
  DTRAIN_CHECK(buf.defined(), "flat store not allocated");
  DTRAIN_CHECK(held(index) || rest_ == Unheld::zeros,
               "{} is not held here (another pipeline stage's)", e.name);
  return buf.view(e.offset, e.spec.shape);
}

int FlatStore::find(std::string_view name) const {
  for (int i = 0; i < size(); ++i) {
    if (entries_[static_cast<size_t>(i)].name == name) return i;
  }
  return -1;
}

Tensor FlatStore::view(std::string_view name) const {
  const int i = find(name);
  if (i < 0) throw Error(fmt::format("no parameter or buffer named \"{}\"", name));
  return view(i);
}

int64_t FlatStore::numel() const {
  int64_t n = 0;
  for (const FlatEntry& e : entries_) n += e.spec.shape.numel();
  return n;
}

}  // namespace dtrain::graph
