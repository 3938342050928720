// Flat storage for parameters, gradients and buffers: one contiguous buffer
// per dtype, each tensor a named view at a fixed, 64-byte-aligned offset. DDP
// buckets, ZeRO shards, grad-norm and checkpoint I/O become loops over ranges.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/op.h"

namespace dtrain::graph {

struct FlatEntry {
  std::string name;    // "layer1.0.conv1.weight"
  ParamSpec spec;      // shape, dtype, group, init
  int node = -1;       // the graph node that owns it
  int64_t offset = 0;  // elements into the flat buffer of spec.dtype
};

// Element j of a parameter of spec `s` as an element of the whole tensor (itself
// unless tensor parallelism cut it): what its initial value is keyed by, so a rank's
// part starts as that part of the one-rank model.
uint64_t whole_index(const ParamSpec& s, int64_t j);

class FlatStore {
 public:
  FlatStore() = default;
  explicit FlatStore(std::vector<FlatEntry> entries);  // assigns offsets; allocates nothing

  // One buffer per dtype, zero-filled, on `device`.
  void allocate(Device device = Device::cpu());
  // Host buffers from `host` (pinned memory, say), zero-filled.
  void allocate_host(Allocator& host);
  // Host buffers in which only the entries with held[i] set exist (zeros), each at its
  // usual offset (its alignment padding included): a pipeline stage's parameters and
  // gradients, addressed as the whole model's (core/tensor.h, Tensor::held_pages). The
  // others are another stage's: view() refuses them, and touching their part of flat()
  // faults.
  // With Unheld::zeros the others read as zeros instead (read-only, committing nothing:
  // frozen parameters' gradients, graph::Executor), and view() gives them.
  void allocate_held(const std::vector<char>& held, Unheld rest = Unheld::absent);
  // Whether an entry is backed (writable); see allocate_held for the others.
  bool held(int index) const { return held_.empty() || held_[static_cast<size_t>(index)] != 0; }
  Unheld unheld() const { return rest_; }
  const std::vector<char>& held_mask() const { return held_; }  // empty: every entry
  // The host memory allocate_held(held) takes (whole pages; core/allocator.h).
  size_t held_bytes(const std::vector<char>& held) const;
  // Each entry from its InitKind, keyed by (seed, name): computed on the host (so
  // every backend starts from the same bits) and copied to the device once.
  void initialize(uint64_t seed);
  // Elements [begin, begin + out.numel()) of this store's f32 buffer as initialize()
  // would write them (padding 0), into `out` (f32, any device), without allocating the
  // store: a ZeRO shard of the fp32 master weights. Every entry must be f32.
  void initialize_range(uint64_t seed, int64_t begin, Tensor& out) const;
  Device device() const { return device_; }
  const std::vector<FlatEntry>& entries() const { return entries_; }
  int size() const { return static_cast<int>(entries_.size()); }
  Tensor view(int index) const;
  Tensor view(std::string_view name) const;  // throws Error naming the missing tensor
  int find(std::string_view name) const;     // -1 when absent
  Tensor flat(DType dtype) const;            // the whole buffer (undefined if none)
  int64_t numel() const;                     // sum of entry sizes (without alignment padding)
  // Elements of the flat buffer of `dtype`, alignment padding included (0 if none);
  // known before allocate().
  int64_t buffer_elems(DType dtype) const;

 private:
  std::vector<FlatEntry> entries_;
  std::vector<std::pair<DType, int64_t>> sizes_;  // elements per dtype buffer
  std::vector<std::pair<DType, Tensor>> buffers_;
  Device device_;
  std::vector<char> held_;  // allocate_held's mask (empty: every entry)
  Unheld rest_ = Unheld::absent;
  // Per dtype buffer, the element ranges of the held entries.
  std::vector<std::pair<DType, std::vector<std::pair<int64_t, int64_t>>>> held_ranges(
      const std::vector<char>& held) const;
};

}  // namespace dtrain::graph
