// CPU softmax over the last dim and fused softmax + cross-entropy, f32 maths
// on f32/f16/bf16 storage. Stability: every exp is of (x - row max) <= 0, and
// log p_j = x_j - lse with lse = max + log sum exp(x - max). Rows run in
// parallel; the loss is a mean of per-row losses summed in double over a fixed
// number of row groups, so it does not depend on the thread count. Cross-entropy's
// row passes (maximum, sum of exponentials, sum, gradient) run on 16-float vectors
// (exp_neg.h) over the row converted to f32 a block at a time, summed in 16 lanes
// then the lanes in order: the same bits whatever the thread count (and on every CPU
// the build's -march contracts alike). CUDA tensors go to
// kernels/cuda/softmax.cu (targets are not checked on the host there).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/cpu/exp_neg.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cpu/vec16.h"
#include "kernels/cuda_ops.h"
#include "kernels/softmax.h"

namespace dtrain::kernels {

namespace {

using cpu_io::load;
using vec::kV;
using vec::splat;
using vec::v16;
using vec::vload;
using vec::vstore;

constexpr int64_t kRowGroups = 256;  // loss partial sums (stack array, fixed count)
constexpr int64_t kBlock = 1024;     // floats of a row converted at a time (kV divides it)

int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 14) / cols); }

// fn(f, j0, n) for each block of the row: f the f32 values of x[j0, j0 + n).
template <typename T, typename Fn>
void row_blocks(const T* x, int64_t cols, Fn&& fn) {
  float buf[kBlock];
  for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
    const int64_t n = std::min(kBlock, cols - j0);
    fn(cpu_io::as_f32(x + j0, buf, n), j0, n);
  }
}

// 16 lanes added in order, then the scalar tail.
float lanes_sum(v16 acc, float tail) {
  float s = 0.0f;
  for (int64_t l = 0; l < kV; ++l) s += acc[l];
  return s + tail;
}

// The row's maximum; NaNs are passed over, as std::max(m, NaN) keeps m.
template <typename T>
float row_maximum(const T* x, int64_t cols) {
  v16 m = splat(-INFINITY);
  float tail = -INFINITY;
  row_blocks(x, cols, [&](const float* f, int64_t, int64_t n) {
    int64_t k = 0;
    for (; k + kV <= n; k += kV) {
      const v16 v = vload(f + k);
      m = v > m ? v : m;
    }
    for (; k < n; ++k) tail = std::max(tail, f[k]);
  });
  for (int64_t l = 0; l < kV; ++l) tail = std::max(tail, m[l]);
  return tail;
}

// sum_j exp(x_j - mx) for a finite mx >= every x_j.
template <typename T>
float row_exp_sum(const T* x, int64_t cols, float mx) {
  v16 acc{};
  float tail = 0.0f;
  const v16 vm = splat(mx);
  row_blocks(x, cols, [&](const float* f, int64_t, int64_t n) {
    int64_t k = 0;
    for (; k + kV <= n; k += kV) acc += vec::exp_neg_v(vload(f + k) - vm);
    for (; k < n; ++k) tail += vec::exp_neg(f[k] - mx);
  });
  return lanes_sum(acc, tail);
}

template <typename T>
float row_sum(const T* x, int64_t cols) {
  v16 acc{};
  float tail = 0.0f;
  row_blocks(x, cols, [&](const float* f, int64_t, int64_t n) {
    int64_t k = 0;
    for (; k + kV <= n; k += kV) acc += vload(f + k);
    for (; k < n; ++k) tail += f[k];
  });
  return lanes_sum(acc, tail);
}

// lse = max + log sum_j exp(x_j - max) of one row.
template <typename T>
float row_lse(const T* x, int64_t cols) {
  const float mx = row_maximum(x, cols);
  if (std::isinf(mx)) return mx;  // all -inf (or a +inf): nothing finite to normalise
  return mx + std::log(row_exp_sum(x, cols, mx));
}

// d_j = g (exp(x_j - lse) - off), at column `target` (-1: none) g (exp(x_t - lse) - on).
// d may be x itself (a gradient written over its input).
template <typename T>
void row_grad(const T* x, T* d, int64_t cols, float lse, float g, float off, float on,
              int64_t target) {
  float out[kBlock];
  const v16 vl = splat(lse), vg = splat(g), voff = splat(off);
  row_blocks(x, cols, [&](const float* f, int64_t j0, int64_t n) {
    const bool here = target >= j0 && target < j0 + n;
    const float xt = here ? f[target - j0] : 0.0f;  // before d overwrites it
    float* o = out;
    if constexpr (std::is_same_v<T, float>) o = d + j0;
    int64_t k = 0;
    for (; k + kV <= n; k += kV) vstore(o + k, vg * (vec::exp_neg_v(vload(f + k) - vl) - voff));
    for (; k < n; ++k) o[k] = g * (vec::exp_neg(f[k] - lse) - off);
    if (here) o[target - j0] = g * (vec::exp_neg(xt - lse) - on);
    if constexpr (!std::is_same_v<T, float>) cpu_io::store_n(out, d + j0, n);
  });
}

template <typename T>
void softmax_rows(int64_t rows, int64_t cols, const T* x, T* y) {
  parallel_for(0, rows, rows_per_task(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      const float lse = row_lse(xr, cols);
      for (int64_t j = 0; j < cols; ++j)
        cpu_io::store(y + r * cols, j, std::exp(load(xr, j) - lse));
    }
  });
}

template <typename T>
void softmax_grad_rows(int64_t rows, int64_t cols, const T* y, const T* dy, T* dx) {
  parallel_for(0, rows, rows_per_task(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* yr = y + r * cols;
      const T* dr = dy + r * cols;
      float dot = 0.0f;
      for (int64_t j = 0; j < cols; ++j) dot += load(dr, j) * load(yr, j);
      for (int64_t j = 0; j < cols; ++j) {
        cpu_io::store(dx + r * cols, j, load(yr, j) * (load(dr, j) - dot));
      }
    }
  });
}

// classes: all of them (a vocabulary-parallel rank holds only some).
void check_targets(const CrossEntropyArgs& a, const Tensor& targets, int64_t classes = 0) {
  if (classes == 0) classes = a.classes;
  const int32_t* t = targets.data<int32_t>();
  for (int64_t r = 0; r < a.rows; ++r) {
    if (t[r] == a.ignore_index || (t[r] >= 0 && t[r] < classes)) continue;
    throw Error(
        fmt::format("cross-entropy: target {} at row {} is outside [0, {})", t[r], r, classes),
        fmt::format("labels must be class indices below {} or the ignore index {}", classes,
                    a.ignore_index));
  }
}

// Row loss = -sum_j q_j log p_j with q = (1 - eps) onehot(t) + eps / C:
//          = lse - (1 - eps) x_t - (eps / C) sum_j x_j.
template <typename T>
double row_loss(const CrossEntropyArgs& a, const T* x, int32_t t, float lse) {
  double loss = lse - (1.0 - a.label_smoothing) * load(x, t);
  if (a.label_smoothing != 0.0f)
    loss -= static_cast<double>(a.label_smoothing) / a.classes * row_sum(x, a.classes);
  return loss;
}

template <typename T>
void xent_forward(const CrossEntropyArgs& a, const T* x, const int32_t* t, float* loss,
                  float* lse) {
  double partial[kRowGroups];
  const int64_t group = (a.rows + kRowGroups - 1) / kRowGroups;
  const int64_t groups = a.rows == 0 ? 0 : (a.rows + group - 1) / group;
  parallel_for(0, groups, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      partial[g] = 0.0;
      for (int64_t r = g * group; r < std::min(a.rows, (g + 1) * group); ++r) {
        const T* xr = x + r * a.classes;
        lse[r] = row_lse(xr, a.classes);
        if (t[r] != a.ignore_index) partial[g] += row_loss(a, xr, t[r], lse[r]);
      }
    }
  });
  double total = 0.0;
  for (int64_t g = 0; g < groups; ++g) total += partial[g];
  int64_t counted = 0;
  for (int64_t r = 0; r < a.rows; ++r) counted += t[r] != a.ignore_index;
  loss[0] = counted == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(counted));
}

// dlogits_j = dloss / count * (p_j - q_j); ignored rows get 0. share: the logits are
// classes [first, first + a.classes) of total (vocabulary-parallel).
template <typename T>
void xent_backward(const CrossEntropyArgs& a, const T* x, const int32_t* t, const float* lse,
                   float dloss, T* dx, ClassShare share = {}) {
  int64_t counted = 0;
  for (int64_t r = 0; r < a.rows; ++r) counted += t[r] != a.ignore_index;
  const float g = counted == 0 ? 0.0f : dloss / static_cast<float>(counted);
  const int64_t total = share.total > 0 ? share.total : a.classes;
  const float off = a.label_smoothing / static_cast<float>(total);
  const float on = 1.0f - a.label_smoothing + off;
  parallel_for(0, a.rows, rows_per_task(a.classes), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * a.classes;
      T* dr = dx + r * a.classes;
      if (t[r] == a.ignore_index) {
        for (int64_t j = 0; j < a.classes; ++j) cpu_io::store(dr, j, 0.0f);
        continue;
      }
      const int64_t local = static_cast<int64_t>(t[r]) - share.first;
      row_grad(xr, dr, a.classes, lse[r], g, off, on, local >= 0 && local < a.classes ? local : -1);
    }
  });
}

void check_xent(std::string_view op, const CrossEntropyArgs& a, const Tensor& logits,
                const Tensor& targets, const Tensor& lse) {
  require_dtype(op, "logits", logits, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "targets", targets, {DType::i32});
  require_dtype(op, "lse", lse, {DType::f32});
  DTRAIN_CHECK(a.rows >= 0 && a.classes >= 1, "{}: {} rows, {} classes", op, a.rows, a.classes);
  require_numel(op, "logits", logits, a.rows * a.classes);
  require_numel(op, "targets", targets, a.rows);
  require_numel(op, "lse", lse, a.rows);
}

}  // namespace

void softmax_forward(int64_t rows, int64_t cols, const Tensor& x, Tensor& y) {
  const Device device = same_device("softmax_forward", {&x, &y});
  require_dtype("softmax_forward", "x", x, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(y.dtype() == x.dtype(), "softmax_forward: y is {}, x is {}", dtype_name(y.dtype()),
               dtype_name(x.dtype()));
  require_numel("softmax_forward", "x", x, rows * cols);
  require_numel("softmax_forward", "y", y, rows * cols);
  if (device.is_cuda()) return cuda_ops::softmax_forward(rows, cols, x, y);
  cpu_io::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_rows(rows, cols, static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()));
  });
}

void softmax_backward(int64_t rows, int64_t cols, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const Device device = same_device("softmax_backward", {&y, &dy, &dx});
  require_dtype("softmax_backward", "y", y, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(dy.dtype() == y.dtype() && dx.dtype() == y.dtype(),
               "softmax_backward: y {}, dy {}, dx {} differ", dtype_name(y.dtype()),
               dtype_name(dy.dtype()), dtype_name(dx.dtype()));
  require_numel("softmax_backward", "y", y, rows * cols);
  require_numel("softmax_backward", "dy", dy, rows * cols);
  require_numel("softmax_backward", "dx", dx, rows * cols);
  if (device.is_cuda()) return cuda_ops::softmax_backward(rows, cols, y, dy, dx);
  cpu_io::dispatch_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_grad_rows(rows, cols, static_cast<const T*>(y.raw()), static_cast<const T*>(dy.raw()),
                      static_cast<T*>(dx.raw()));
  });
}

void softmax_cross_entropy_forward(const CrossEntropyArgs& args, const Tensor& logits,
                                   const Tensor& targets, Tensor& loss, Tensor& lse) {
  const Device device =
      same_device("softmax_cross_entropy_forward", {&logits, &targets, &loss, &lse});
  check_xent("softmax_cross_entropy_forward", args, logits, targets, lse);
  require_dtype("softmax_cross_entropy_forward", "loss", loss, {DType::f32});
  require_numel("softmax_cross_entropy_forward", "loss", loss, 1);
  if (device.is_cuda()) {
    return cuda_ops::softmax_cross_entropy_forward(args, logits, targets, loss, lse);
  }
  check_targets(args, targets);
  cpu_io::dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    xent_forward(args, static_cast<const T*>(logits.raw()), targets.data<int32_t>(),
                 loss.data<float>(), lse.data<float>());
  });
}

void softmax_cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& logits,
                                    const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                                    Tensor& dlogits) {
  const Device device =
      same_device("softmax_cross_entropy_backward", {&logits, &targets, &lse, &dloss, &dlogits});
  DTRAIN_CHECK(dloss.dtype() == DType::f32 && dloss.numel() == 1,
               "softmax_cross_entropy_backward: dloss must be f32 [1], got {}", dloss.str());
  check_xent("softmax_cross_entropy_backward", args, logits, targets, lse);
  DTRAIN_CHECK(dlogits.dtype() == logits.dtype(), "softmax_cross_entropy_backward: dlogits is {}",
               dtype_name(dlogits.dtype()));
  require_numel("softmax_cross_entropy_backward", "dlogits", dlogits, args.rows * args.classes);
  if (device.is_cuda()) {
    return cuda_ops::softmax_cross_entropy_backward(args, logits, targets, lse, dloss, dlogits);
  }
  check_targets(args, targets);
  cpu_io::dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    xent_backward(args, static_cast<const T*>(logits.raw()), targets.data<int32_t>(),
                  lse.data<float>(), dloss.data<float>()[0], static_cast<T*>(dlogits.raw()));
  });
}

namespace {

void check_share(std::string_view op, const CrossEntropyArgs& a, const ClassShare& share,
                 const Tensor& logits, const Tensor& targets) {
  DTRAIN_CHECK(logits.device().is_cpu() && targets.device().is_cpu(), "{}: CPU tensors only", op);
  DTRAIN_CHECK(share.first >= 0 && share.first + a.classes <= share.total,
               "{}: classes [{}, {}) of {}", op, share.first, share.first + a.classes, share.total);
  require_dtype(op, "logits", logits, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "targets", targets, {DType::i32});
  require_numel(op, "logits", logits, a.rows * a.classes);
  require_numel(op, "targets", targets, a.rows);
}

}  // namespace

void cross_entropy_row_max(const CrossEntropyArgs& a, const Tensor& logits, Tensor& row_max) {
  DTRAIN_CHECK(logits.device().is_cpu(), "cross_entropy_row_max: CPU tensors only");
  require_dtype("cross_entropy_row_max", "row_max", row_max, {DType::f32});
  require_numel("cross_entropy_row_max", "logits", logits, a.rows * a.classes);
  require_numel("cross_entropy_row_max", "row_max", row_max, a.rows);
  float* mx = row_max.data<float>();
  cpu_io::dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.raw());
    parallel_for(0, a.rows, rows_per_task(a.classes), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) mx[r] = row_maximum(x + r * a.classes, a.classes);
    });
  });
}

void cross_entropy_row_sums(const CrossEntropyArgs& a, const ClassShare& share,
                            const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            Tensor& sums) {
  check_share("cross_entropy_row_sums", a, share, logits, targets);
  require_numel("cross_entropy_row_sums", "row_max", row_max, a.rows);
  require_dtype("cross_entropy_row_sums", "sums", sums, {DType::f32});
  require_numel("cross_entropy_row_sums", "sums", sums, 3 * a.rows);
  check_targets(a, targets, share.total);
  const float* mx = row_max.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float* out = sums.data<float>();
  cpu_io::dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.raw());
    parallel_for(0, a.rows, rows_per_task(a.classes), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * a.classes;
        const float e = std::isinf(mx[r]) ? 0.0f : row_exp_sum(xr, a.classes, mx[r]);
        const float all = a.label_smoothing != 0.0f ? row_sum(xr, a.classes) : 0.0f;
        const int64_t local = static_cast<int64_t>(t[r]) - share.first;
        out[3 * r] = e;
        out[3 * r + 1] =
            t[r] != a.ignore_index && local >= 0 && local < a.classes ? load(xr, local) : 0.0f;
        out[3 * r + 2] = all;
      }
    });
  });
}

void cross_entropy_finish(const CrossEntropyArgs& a, const ClassShare& share, const Tensor& targets,
                          const Tensor& row_max, const Tensor& sums, Tensor& loss, Tensor& lse) {
  require_numel("cross_entropy_finish", "targets", targets, a.rows);
  require_numel("cross_entropy_finish", "row_max", row_max, a.rows);
  require_numel("cross_entropy_finish", "sums", sums, 3 * a.rows);
  require_numel("cross_entropy_finish", "loss", loss, 1);
  require_numel("cross_entropy_finish", "lse", lse, a.rows);
  const int32_t* t = targets.data<int32_t>();
  const float* mx = row_max.data<float>();
  const float* s = sums.data<float>();
  float* l = lse.data<float>();
  double total = 0.0;  // rows in order, in double (the loss is one number; no threads)
  int64_t counted = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    l[r] = std::isinf(mx[r]) ? mx[r] : mx[r] + std::log(s[3 * r]);
    if (t[r] == a.ignore_index) continue;
    double row = l[r] - (1.0 - a.label_smoothing) * s[3 * r + 1];
    if (a.label_smoothing != 0.0f)
      row -= static_cast<double>(a.label_smoothing) / share.total * s[3 * r + 2];
    total += row;
    ++counted;
  }
  loss.data<float>()[0] =
      counted == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(counted));
}

void cross_entropy_share_backward(const CrossEntropyArgs& a, const ClassShare& share,
                                  const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& dloss, Tensor& dlogits) {
  check_share("cross_entropy_share_backward", a, share, logits, targets);
  require_numel("cross_entropy_share_backward", "lse", lse, a.rows);
  require_numel("cross_entropy_share_backward", "dlogits", dlogits, a.rows * a.classes);
  DTRAIN_CHECK(
      dlogits.dtype() == logits.dtype() && dloss.numel() == 1 && dloss.dtype() == DType::f32,
      "cross_entropy_share_backward: dlogits {}, dloss {}", dlogits.str(), dloss.str());
  cpu_io::dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    xent_backward(a, static_cast<const T*>(logits.raw()), targets.data<int32_t>(),
                  lse.data<float>(), dloss.data<float>()[0], static_cast<T*>(dlogits.raw()), share);
  });
}

}  // namespace dtrain::kernels
