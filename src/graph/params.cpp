// Flat buffers and deterministic initialisation. Each tensor's numbers come
// from Philox keyed by (seed, hash of its name), so adding a layer elsewhere
// never changes how an existing one is initialised.
#include "graph/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/checksum.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "kernels/memory.h"

namespace dtrain::graph {

namespace {

constexpr uint32_t kInitPurpose = 1;

int64_t align_elems(int64_t n, DType dt) {
  const int64_t per = std::max<int64_t>(1, 64 / static_cast<int64_t>(dtype_size(dt)));
  return (n + per - 1) / per * per;
}

// Values first .. first + n - 1 of entry `s`, before the cast to its dtype: a normal or
// uniform draw per value (Philox::normals / uniforms, the words drawn in bulk), scaled.
void init_values(const ParamSpec& s, const Philox& rng, uint64_t first, int64_t n, float* out) {
  switch (s.init) {
    case InitKind::zeros:
    case InitKind::ones:
      std::fill(out, out + n, s.init == InitKind::ones ? 1.0f : 0.0f);
      return;
    case InitKind::normal:
    case InitKind::kaiming_normal: {
      rng.normals(first, n, out);
      const float scale = s.init == InitKind::normal
                              ? static_cast<float>(s.scale)
                              : std::sqrt(2.0f / static_cast<float>(s.fan_in));
      for (int64_t k = 0; k < n; ++k) out[k] = scale * out[k];
      return;
    }
    case InitKind::uniform: {
      rng.uniforms(first, n, out);
      const float scale = static_cast<float>(s.scale);
      for (int64_t k = 0; k < n; ++k) out[k] = scale * (2.0f * out[k] - 1.0f);
      return;
    }
    case InitKind::kaiming_uniform: {
      rng.uniforms(first, n, out);
      const float bound = std::sqrt(static_cast<float>(s.fan_in));
      for (int64_t k = 0; k < n; ++k) out[k] = (2.0f * out[k] - 1.0f) / bound;
      return;
    }
  }
}

// Entry-local elements j, j + 1, ... whose whole-tensor indices follow one another from
// whole_index(s, j): to the end of the entry, or of the split dimension's chunk (within
// a chunk, the next index along the split dimension is the whole tensor's next too).
int64_t contiguous_from(const ParamSpec& s, int64_t j) {
  const int64_t n = s.shape.numel();
  if (!s.split.split()) return n - j;
  int64_t inner = 1;
  for (int k = s.split.dim + 1; k < s.shape.rank(); ++k) inner *= s.shape[k];
  const int64_t extent = s.shape[s.split.dim], per_chunk = extent / s.split.chunks;
  const int64_t l = j / inner % extent;
  return (per_chunk - l % per_chunk) * inner - j % inner;
}

// Entry `s`'s values for its elements [begin, end), into out[0 .. end - begin).
void init_entry(const ParamSpec& s, const Philox& rng, int64_t begin, int64_t end, float* out) {
  for (int64_t j = begin; j < end;) {
    const int64_t run = std::min(end - j, contiguous_from(s, j));
    init_values(s, rng, whole_index(s, j), run, out + (j - begin));
    j += run;
  }
}

// Entry `s`'s elements [begin, end) as T into out[0 .. end - begin), in parallel chunks
// (each value is a function of its index alone, so the bits do not depend on threads).
template <typename T>
void init_into(const ParamSpec& s, const Philox& rng, int64_t begin, int64_t end, T* out) {
  parallel_for(begin, end, int64_t{1} << 16, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<T, float>) {
      init_entry(s, rng, lo, hi, out + (lo - begin));
    } else {
      constexpr int64_t kChunk = 4096;  // values drawn at a time, then cast
      float x[kChunk];
      for (int64_t j = lo; j < hi; j += kChunk) {
        const int64_t m = std::min(kChunk, hi - j);
        init_entry(s, rng, j, j + m, x);
        for (int64_t k = 0; k < m; ++k) {
          if constexpr (std::is_same_v<T, f16>) {
            out[j - begin + k] = to_f16(x[k]);
          } else {
            out[j - begin + k] = to_bf16(x[k]);
          }
        }
      }
    }
  });
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
    DTRAIN_CHECK(v.dtype() == DType::f32 || v.dtype() == DType::f16 || v.dtype() == DType::bf16,
                 "{}: cannot initialise {}", e.name, dtype_name(v.dtype()));
    if (v.dtype() == DType::f32) {
      init_into(e.spec, rng, 0, n, v.data<float>());
    } else if (v.dtype() == DType::f16) {
      init_into(e.spec, rng, 0, n, v.data<f16>());
    } else {
      init_into(e.spec, rng, 0, n, v.data<bf16>());
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
    init_into(e.spec, rng, lo - e.offset, hi - e.offset, host.data<float>() + (lo - begin));
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
