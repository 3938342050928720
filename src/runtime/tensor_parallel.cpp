// Tensor parallelism's runtime side (runtime/tensor_parallel.h).
#include "runtime/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "optim/clip.h"

namespace dtrain::runtime {

void CommTensorGroup::attach(dist::Communicator& comm) {
  DTRAIN_CHECK(comm.size() == size_ && comm.rank() == rank_,
               "tensor group: rank {} of {} attached to a communicator's rank {} of {}", rank_,
               size_, comm.rank(), comm.size());
  comm_ = &comm;
}

void CommTensorGroup::all_reduce(Tensor& t, graph::GroupReduce op) {
  DTRAIN_CHECK(comm_ != nullptr, "tensor group used before start-up attached its communicator");
  const dist::ReduceOp how =
      op == graph::GroupReduce::max ? dist::ReduceOp::max : dist::ReduceOp::sum;
  if (t.dtype() == DType::f32 || comm_->backend() == "nccl") {
    comm_->all_reduce(t, how);
    return;
  }
  Tensor wide = Tensor::empty(t.shape(), DType::f32, &kernels::device_allocator(t.device()));
  kernels::cast(t, wide);
  comm_->all_reduce(wide, how);
  kernels::cast(wide, t);
}

std::vector<graph::FlatEntry> whole_f32_layout(const graph::Graph& g) {
  std::vector<graph::FlatEntry> entries = g.param_layout();
  for (graph::FlatEntry& e : entries) e.spec.dtype = DType::f32;
  return graph::FlatStore(std::move(entries)).entries();
}

namespace {

// Calls fn(local element, whole element) over every element of a split entry's part,
// or of a replicated entry when `replicated`; only entries whose whole tensor meets the
// whole layout's [lo, hi) (fn checks its own elements).
template <typename Fn>
void for_each_pair(const std::vector<graph::FlatEntry>& local_layout,
                   const std::vector<graph::FlatEntry>& whole_layout, bool replicated, Fn&& fn,
                   int64_t lo = 0, int64_t hi = std::numeric_limits<int64_t>::max()) {
  DTRAIN_CHECK(local_layout.size() == whole_layout.size(), "{} split entries for {} whole ones",
               local_layout.size(), whole_layout.size());
  for (size_t i = 0; i < local_layout.size(); ++i) {
    const graph::FlatEntry& l = local_layout[i];
    const graph::FlatEntry& w = whole_layout[i];
    DTRAIN_CHECK(l.name == w.name, "entry {}: {} vs {}", i, l.name, w.name);
    if (!l.spec.split.split() && !replicated) continue;
    if (w.offset >= hi || w.offset + w.spec.shape.numel() <= lo) continue;
    const int64_t n = l.spec.shape.numel();
    const auto whole = [&](int64_t j) {
      return w.offset + static_cast<int64_t>(graph::whole_index(l.spec, j));
    };
    // whole_index increases with j (a part keeps the whole's element order; checked for
    // every split in tests/models/test_tensor_parallel.cpp), so the local
    // elements inside [lo, hi) are one run: its start found by bisection, so that a
    // piece costs its own elements, not the entry's (a resume streams many pieces).
    int64_t j = 0;
    for (int64_t b = n; j < b;) {
      const int64_t mid = j + (b - j) / 2;
      if (whole(mid) < lo) {
        j = mid + 1;
      } else {
        b = mid;
      }
    }
    for (; j < n; ++j) {
      const int64_t at = whole(j);
      if (at >= hi) break;
      fn(l.offset + j, at);
    }
  }
}

}  // namespace

void add_local_to_whole_range(const Tensor& local,
                              const std::vector<graph::FlatEntry>& local_layout,
                              const std::vector<graph::FlatEntry>& whole_layout, bool replicated,
                              int64_t lo, Tensor& out, int64_t base) {
  const Tensor src = kernels::to_host(local);
  DTRAIN_CHECK(src.dtype() == DType::f32 && out.dtype() == DType::f32 && out.device().is_cpu(),
               "add_local_to_whole_range: f32 buffers, the range on the host");
  const float* s = src.data<float>();
  float* d = out.data<float>();
  const int64_t hi = lo + out.numel(), end = base + src.numel();
  for_each_pair(
      local_layout, whole_layout, replicated,
      [&](int64_t l, int64_t w) {
        if (w >= lo && w < hi && l >= base && l < end) d[w - lo] += s[l - base];
      },
      lo, hi);
}

WholeRange assemble_range(dist::Communicator& tensor, dist::Communicator* data,
                          const std::vector<Tensor>& state, const RangeAssembly& a) {
  const bool writer = data == nullptr || data->rank() == 0;
  WholeRange mine;
  mine.range = shard_of(a.span, tensor.rank(), tensor.size(), a.base);
  const auto assemble = [&](const Tensor& local, Tensor* out) {
    Tensor piece = Tensor::empty(Shape{mine.range.block + a.span % tensor.size()}, DType::f32);
    for (int r = 0; r < tensor.size(); ++r) {  // each owner's range in turn
      const ShardRange owner = shard_of(a.span, r, tensor.size(), a.base);
      Tensor part = piece.view(0, Shape{owner.size()});
      kernels::fill(part, -0.0f);  // the identity of addition: a -0 part stays -0
      add_local_to_whole_range(local, *a.local_layout, *a.whole_layout, a.replicated, owner.begin,
                               part, a.local_base);
      if (data != nullptr && data->size() > 1) data->reduce(part, 0);
      if (!writer) continue;
      tensor.reduce(part, r);
      if (r == tensor.rank()) kernels::copy(part, *out);
    }
  };
  if (writer) mine.params = Tensor::empty(Shape{mine.range.size()}, DType::f32);
  assemble(state[0], &mine.params);
  if (writer) {
    // A container of the assembled state, written into directly: whole buffers (a frozen
    // segment's range would be read-only zeros; it assembles to zeros here anyway).
    std::vector<optim::ParamSegment> segments = optim::shard_segments(
        a.segments, mine.range.begin, mine.range.end, optim::SegmentSplit::allowed);
    for (optim::ParamSegment& s : segments) s.frozen = false;
    mine.opt =
        optim::make_optimizer(a.options, std::move(segments), mine.range.size(), Device::cpu());
    optim::OptimizerState st = mine.opt->state();
    DTRAIN_CHECK(st.buffers.size() + 2 == state.size(), "{} optimizer buffers, {} state tensors",
                 st.buffers.size(), state.size());
    for (size_t b = 2; b < state.size(); ++b) assemble(state[b], &st.buffers[b - 2].second);
    st.step = a.step;
    mine.opt->load_state(st);
  } else {  // the other data ranks add their shards' parts only
    for (size_t b = 2; b < state.size(); ++b) assemble(state[b], nullptr);
  }
  return mine;
}

std::vector<int64_t> replicated_digests(const std::vector<Tensor>& tensors,
                                        const std::vector<graph::FlatEntry>& layout, int64_t base) {
  std::vector<int64_t> out;
  for (const Tensor& t : tensors) {
    const Tensor host = kernels::to_host(t);
    DTRAIN_CHECK(host.dtype() == DType::f32, "replicated_digests: f32 tensors, not {}",
                 dtype_name(host.dtype()));
    const auto* bits = static_cast<const uint32_t*>(host.raw());
    for (const graph::FlatEntry& e : layout) {
      if (e.spec.split.split()) continue;
      const int64_t lo = std::max(e.offset, base);
      const int64_t hi = std::min(e.offset + e.spec.shape.numel(), base + host.numel());
      int64_t sum = 0;  // < 2^32 per element: no overflow below 2^31 elements
      for (int64_t x = lo; x < hi; ++x) {
        uint64_t h = (static_cast<uint64_t>(x - e.offset) << 32) | bits[x - base];
        h ^= h >> 33;  // MurmurHash3's 64-bit finaliser (fmix64)
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
        h *= 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 33;
        sum += static_cast<int64_t>(h & 0xffffffffull);
      }
      out.push_back(sum);
    }
  }
  return out;
}

void whole_range_to_local(const Tensor& piece, int64_t lo,
                          const std::vector<graph::FlatEntry>& whole_layout,
                          const std::vector<graph::FlatEntry>& local_layout, Tensor& local,
                          int64_t base) {
  const Tensor src = kernels::to_host(piece);
  DTRAIN_CHECK(src.dtype() == DType::f32 && local.dtype() == DType::f32 && local.device().is_cpu(),
               "whole_range_to_local: f32 buffers, the local one on the host");
  const float* s = src.data<float>();
  float* d = local.data<float>();
  const int64_t hi = lo + src.numel(), end = base + local.numel();
  for_each_pair(
      local_layout, whole_layout, true,
      [&](int64_t l, int64_t w) {
        if (w >= lo && w < hi && l >= base && l < end) d[l - base] = s[w - lo];
      },
      lo, hi);
}

double tensor_sum_squares(const Tensor& grads, const std::vector<graph::FlatEntry>& layout,
                          bool replicated, int64_t base) {
  double sum = 0;
  for (const graph::FlatEntry& e : layout) {
    if (!e.spec.split.split() && !replicated) continue;
    const int64_t lo = std::max(e.offset, base);
    const int64_t hi = std::min(e.offset + e.spec.shape.numel(), base + grads.numel());
    if (lo < hi) sum += optim::grad_sum_squares(grads.view(lo - base, Shape{hi - lo}));
  }
  return sum;
}

std::vector<int64_t> split_argmax(const Tensor& logits, int64_t begin, graph::TensorGroup& group) {
  const int64_t rows = logits.dim(0), count = logits.dim(1);
  Tensor best = Tensor::empty({rows}, DType::f32);
  Tensor index = Tensor::empty({rows}, DType::f32);  // minus the whole index: max = first
  std::vector<int64_t> local(static_cast<size_t>(rows));
  const float* x = logits.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * count;
    const int64_t j = std::max_element(row, row + count) - row;
    best.data<float>()[r] = row[j];
    local[static_cast<size_t>(r)] = begin + j;
  }
  group.all_reduce(best, graph::GroupReduce::max);
  for (int64_t r = 0; r < rows; ++r) {
    // Ties across ranks: the lowest whole index, as std::max_element over the whole row.
    index.data<float>()[r] =
        x[r * count + (local[static_cast<size_t>(r)] - begin)] == best.data<float>()[r]
            ? -static_cast<float>(local[static_cast<size_t>(r)])
            : -std::numeric_limits<float>::infinity();
  }
  group.all_reduce(index, graph::GroupReduce::max);
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    out[static_cast<size_t>(r)] = static_cast<int64_t>(-index.data<float>()[r]);
  return out;
}

}  // namespace dtrain::runtime
