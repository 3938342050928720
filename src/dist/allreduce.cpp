// Ring arithmetic and the `auto` tuner. Timing uses only the Communicator
// interface, so the tuner works over any backend (self included).
#include "dist/allreduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::dist {

Segment ring_segment(size_t n, int parts, int index) {
  DTRAIN_CHECK(parts > 0 && index >= 0 && index < parts, "segment {} of {}", index, parts);
  const size_t p = static_cast<size_t>(parts), i = static_cast<size_t>(index);
  const size_t base = n / p, extra = n % p;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

namespace {
int mod(int a, int m) { return ((a % m) + m) % m; }
}  // namespace

RingStep ring_reduce_scatter_step(int rank, int size, int step) {
  return {mod(rank - step, size), mod(rank - step - 1, size)};
}

RingStep ring_all_gather_step(int rank, int size, int step) {
  return {mod(rank + 1 - step, size), mod(rank - step, size)};
}

int ring_owned_segment(int rank, int size) { return mod(rank + 1, size); }

size_t ring_piece_count(size_t count, size_t piece) {
  DTRAIN_CHECK(piece > 0);
  return (count + piece - 1) / piece;
}

AllreduceAlgo AutoChoice::algo_for(size_t bytes) const {
  if (entries.empty()) return AllreduceAlgo::native;
  const size_t cls = std::bit_ceil(std::max<size_t>(bytes, 1));
  for (const AutoEntry& e : entries) {
    if (std::bit_ceil(std::max<size_t>(e.bytes, 1)) >= cls) return e.algo;
  }
  return entries.back().algo;
}

namespace {

using Clock = std::chrono::steady_clock;

// The largest bucket of each power-of-two class, ascending.
std::vector<size_t> size_classes(const std::vector<size_t>& bucket_bytes) {
  std::vector<size_t> out;
  for (size_t b : bucket_bytes) {
    const size_t cls = std::bit_ceil(std::max<size_t>(b, 1));
    auto same = std::find_if(out.begin(), out.end(), [&](size_t o) {
      return std::bit_ceil(std::max<size_t>(o, 1)) == cls;
    });
    if (same == out.end()) {
      out.push_back(b);
    } else {
      *same = std::max(*same, b);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<AllreduceAlgo> candidates(Communicator& comm, bool hierarchical) {
  std::vector<AllreduceAlgo> algos{AllreduceAlgo::native, AllreduceAlgo::ring};
  if (hierarchical && hierarchical_possible(comm)) algos.push_back(AllreduceAlgo::hierarchical);
  return algos;
}

// This rank's median seconds of `reps` all-reduces (after one warm-up).
double time_allreduce(Communicator& comm, Tensor& buf, AllreduceAlgo algo, int reps) {
  comm.all_reduce(buf, ReduceOp::sum, algo);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    const auto t0 = Clock::now();
    comm.all_reduce(buf, ReduceOp::sum, algo);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace

bool hierarchical_possible(Communicator& comm) {
  const Topology topo = comm.topology();
  return topo.nodes > 1 && topo.ranks_per_node > 1;
}

AutoChoice tune_allreduce(Communicator& comm, const std::vector<size_t>& bucket_bytes, int reps,
                          const Tensor& scratch, bool hierarchical) {
  DTRAIN_CHECK(reps > 0);
  const std::vector<size_t> classes = size_classes(bucket_bytes);
  const std::vector<AllreduceAlgo> algos = candidates(comm, hierarchical);
  // One f64 per (class, algo), reduced with max in one collective: identical tables.
  std::vector<double> times(classes.size() * algos.size(), 0.0);
  for (size_t c = 0; c < classes.size(); ++c) {
    const int64_t n = static_cast<int64_t>((classes[c] + 3) / 4);
    const bool borrowed = scratch.defined() && scratch.dtype() == DType::f32 &&
                          scratch.device() == comm.device() && scratch.numel() >= n;
    Tensor buf = borrowed
                     ? scratch.view(0, Shape{n})
                     : Tensor::empty({n}, DType::f32, &kernels::device_allocator(comm.device()));
    kernels::fill(buf, 1.0f);  // not zeros or garbage: denormals would time slower
    for (size_t a = 0; a < algos.size(); ++a) {
      times[c * algos.size() + a] = time_allreduce(comm, buf, algos[a], reps);
    }
    if (borrowed) kernels::fill(buf, 0.0f);
  }
  Tensor all = Tensor::wrap(times.data(), {static_cast<int64_t>(times.size())}, DType::f64);
  if (comm.device().is_cpu()) {
    comm.all_reduce(all, ReduceOp::max, AllreduceAlgo::native);
  } else {
    Tensor dev = Tensor::empty(all.shape(), DType::f64, &kernels::device_allocator(comm.device()));
    kernels::copy(all, dev);
    comm.all_reduce(dev, ReduceOp::max, AllreduceAlgo::native);
    kernels::copy(dev, all);
  }

  AutoChoice choice;
  for (size_t c = 0; c < classes.size(); ++c) {
    AutoEntry e;
    e.bytes = classes[c];
    double best = 0.0;
    for (size_t a = 0; a < algos.size(); ++a) {
      const double s = times[c * algos.size() + a];
      e.seconds.emplace_back(algos[a], s);
      if (a == 0 || s < best) {
        best = s;
        e.algo = algos[a];
      }
    }
    choice.entries.push_back(std::move(e));
  }
  return choice;
}

AutoChoice broadcast_choice(Communicator& comm, const AutoChoice& choice, int root) {
  int64_t n = static_cast<int64_t>(choice.entries.size());
  Tensor n_t = Tensor::wrap(&n, Shape{1}, DType::i64);
  comm.broadcast(n_t, root);
  std::vector<int64_t> rows(static_cast<size_t>(2 * n), 0);
  if (comm.rank() == root) {
    for (size_t i = 0; i < choice.entries.size(); ++i) {
      rows[2 * i] = static_cast<int64_t>(choice.entries[i].bytes);
      rows[2 * i + 1] = static_cast<int64_t>(choice.entries[i].algo);
    }
  }
  if (n > 0) {
    Tensor rows_t = Tensor::wrap(rows.data(), Shape{2 * n}, DType::i64);
    comm.broadcast(rows_t, root);
  }
  if (comm.rank() == root) return choice;
  AutoChoice out;
  for (int64_t i = 0; i < n; ++i) {
    AutoEntry e;
    e.bytes = static_cast<size_t>(rows[static_cast<size_t>(2 * i)]);
    e.algo = static_cast<AllreduceAlgo>(rows[static_cast<size_t>(2 * i + 1)]);
    out.entries.push_back(e);
  }
  return out;
}

namespace {
std::string human_bytes(size_t b) {
  if (b >= (size_t{1} << 20)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}
}  // namespace

std::string format_auto_choice(const AutoChoice& choice, const std::string& title) {
  std::string out = title + "\n";
  for (const AutoEntry& e : choice.entries) {
    std::string line = fmt::format("  {:>10} -> {:<12}", human_bytes(e.bytes), to_string(e.algo));
    for (const auto& [algo, s] : e.seconds) {
      line += fmt::format("  {} {:.3f} ms", to_string(algo), s * 1e3);
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace dtrain::dist
