// CPU whole-tensor reductions. The tensor is cut into fixed blocks of
// kReduceBlock elements; each block's partial (a double) goes to the workspace
// and the partials are combined left to right, so the result never depends on
// the thread count. Within a block, 8 interleaved double accumulators (a fixed
// order) let the loop vectorise. Mean of 0 elements is NaN (as PyTorch).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/reduce.h"

namespace dtrain::kernels {

namespace {

using cpu_io::kBlock;

constexpr int64_t kReduceBlock = 4096;
constexpr int kLanes = 8;

int64_t block_count(int64_t numel) { return (numel + kReduceBlock - 1) / kReduceBlock; }

// x[0, n) as doubles through `buf`, n <= kBlock.
template <typename T>
void load_f64(const T* x, int64_t n, double* buf) {
  if constexpr (std::is_same_v<T, double>) {
    std::copy_n(x, n, buf);
  } else {
    float f[kBlock];
    const float* v = cpu_io::as_f32(x, f, n);
    for (int64_t i = 0; i < n; ++i) buf[i] = v[i];
  }
}

// One block's partial: sum, sum of squares, max |x| (NaN if any NaN), or 1/0
// for "holds a non-finite value". `step` folds one element into an accumulator.
template <typename T, typename Step>
double block_partial(const T* x, int64_t n, Step step, double (*combine)(double, double)) {
  double acc[kLanes] = {};
  double buf[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    load_f64(x + i0, m, buf);
    int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes) {
      for (int k = 0; k < kLanes; ++k) acc[k] = step(acc[k], buf[i + k]);
    }
    for (; i < m; ++i) acc[0] = step(acc[0], buf[i]);
  }
  double r = acc[0];
  for (int k = 1; k < kLanes; ++k) r = combine(r, acc[k]);
  return r;
}

double add(double a, double b) { return a + b; }
// max that propagates NaN (std::max would drop it depending on the order).
double max_nan(double a, double b) { return (a > b || std::isnan(a)) ? a : b; }
double either(double a, double b) { return (a != 0.0 || b != 0.0) ? 1.0 : 0.0; }

template <typename T>
double partial(Reduction op, const T* x, int64_t n) {
  switch (op) {
    case Reduction::sum:
    case Reduction::mean:
      return block_partial(x, n, add, add);
    case Reduction::l2_norm:
      return block_partial(
          x, n, [](double a, double v) { return a + v * v; }, add);
    case Reduction::max_abs:
      return block_partial(
          x, n, [](double a, double v) { return max_nan(a, std::abs(v)); }, max_nan);
    case Reduction::has_inf_or_nan:
      // !(|v| <= max) is true exactly for +-Inf and NaN.
      return block_partial(
          x, n,
          [](double a, double v) {
            return (a != 0.0 || !(std::abs(v) <= std::numeric_limits<double>::max())) ? 1.0 : 0.0;
          },
          either);
  }
  DTRAIN_CHECK(false, "reduce: bad op {}", static_cast<int>(op));
}

double finish(Reduction op, const double* partials, int64_t blocks, int64_t numel) {
  double r = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    switch (op) {
      case Reduction::sum:
      case Reduction::mean:
      case Reduction::l2_norm:
        r += partials[b];
        break;
      case Reduction::max_abs:
        r = max_nan(r, partials[b]);
        break;
      case Reduction::has_inf_or_nan:
        r = either(r, partials[b]);
        break;
    }
  }
  if (op == Reduction::mean) {
    return numel == 0 ? std::numeric_limits<double>::quiet_NaN() : r / static_cast<double>(numel);
  }
  return op == Reduction::l2_norm ? std::sqrt(r) : r;
}

template <typename Fn>
void dispatch_reduce(DType t, Fn&& fn) {
  if (t == DType::f64) return fn(double{});
  cpu_io::dispatch_float(t, fn);
}

}  // namespace

size_t reduce_workspace_bytes(int64_t numel) {
  return static_cast<size_t>(block_count(numel)) * sizeof(double) + 64;  // + alignment slack
}

void reduce(Reduction op, const Tensor& x, Tensor& out, Workspace ws) {
  const Device device = same_device("reduce", {&x, &out});
  require_dtype("reduce", "x", x, {DType::f32, DType::f16, DType::bf16, DType::f64});
  require_dtype("reduce", "out", out, {DType::f32});
  require_numel("reduce", "out", out, 1);
  if (device.is_cuda()) return cuda_ops::reduce(op, x, out, ws);
  const int64_t n = x.numel();
  const int64_t blocks = block_count(n);
  size_t offset = 0;
  double* partials = ws.take<double>(offset, static_cast<size_t>(blocks));
  dispatch_reduce(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.raw());
    parallel_for(0, blocks, 4, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        const int64_t begin = b * kReduceBlock;
        partials[b] = partial(op, p + begin, std::min(kReduceBlock, n - begin));
      }
    });
  });
  out.data<float>()[0] = static_cast<float>(finish(op, partials, blocks, n));
}

}  // namespace dtrain::kernels
