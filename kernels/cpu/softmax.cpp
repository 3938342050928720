// CPU softmax over the last dim and fused softmax + cross-entropy, f32 maths
// on f32/f16/bf16 storage. Stability: every exp is of (x - row max) <= 0, and
// log p_j = x_j - lse with lse = max + log sum exp(x - max). Rows run in
// parallel; the loss is a mean of per-row losses summed in double over a fixed
// number of row groups, so it does not depend on the thread count. CUDA tensors
// go to kernels/cuda/softmax.cu (targets are not checked on the host there).
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/softmax.h"

namespace dtrain::kernels {

namespace {

using cpu_io::load;

constexpr int64_t kRowGroups = 256;  // loss partial sums (stack array, fixed count)

int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 14) / cols); }

// lse = max + log sum_j exp(x_j - max) of one row.
template <typename T>
float row_lse(const T* x, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, load(x, j));
  if (std::isinf(mx)) return mx;  // all -inf (or a +inf): nothing finite to normalise
  float s = 0.0f;
  for (int64_t j = 0; j < cols; ++j) s += std::exp(load(x, j) - mx);
  return mx + std::log(s);
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
  if (a.label_smoothing != 0.0f) {
    float s = 0.0f;
    for (int64_t j = 0; j < a.classes; ++j) s += load(x, j);
    loss -= static_cast<double>(a.label_smoothing) / a.classes * s;
  }
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
      const bool ignored = t[r] == a.ignore_index;
      for (int64_t j = 0; j < a.classes; ++j) {
        const float q = j + share.first == t[r] ? on : off;
        cpu_io::store(dr, j, ignored ? 0.0f : g * (std::exp(load(xr, j) - lse[r]) - q));
      }
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
      for (int64_t r = lo; r < hi; ++r) {
        float m = -INFINITY;
        for (int64_t j = 0; j < a.classes; ++j) m = std::max(m, load(x + r * a.classes, j));
        mx[r] = m;
      }
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
        float e = 0.0f, all = 0.0f;
        if (!std::isinf(mx[r])) {
          for (int64_t j = 0; j < a.classes; ++j) e += std::exp(load(xr, j) - mx[r]);
        }
        if (a.label_smoothing != 0.0f) {
          for (int64_t j = 0; j < a.classes; ++j) all += load(xr, j);
        }
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
