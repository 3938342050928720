// CPU memory-efficient attention (FlashAttention-style). Forward: per (b, h,
// query tile), loop over key tiles with an online softmax. Backward recomputes
// P = exp(S - lse) per tile in two passes: one task per (b, h, key tile) sums
// dK, dV over all queries; one per (b, h, query tile) sums dQ over all keys.
// Each output element is summed by one task in a fixed order: bit-identical for
// any thread count, no atomics. Workspace: per-thread f32 tiles only.
#include "kernels/attention.h"

#include <omp.h>

#include <cmath>

#include "kernels/cpu/float_io.h"

namespace dtrain::kernels {
namespace {

constexpr int64_t kBq = 32;  // query rows per tile
constexpr int64_t kBk = 64;  // keys per tile (the SIMD width of the score loops)

// exp(x) for x <= 0, vectorisable: 2^n * poly(r), Cephes coefficients (~1 ulp).
// Returns exactly 0 below -87 (where float exp underflows), incl. x = -inf.
inline float exp_neg(float x) {
  const float xc = std::max(x, -87.0f);
  const float n = std::floor(xc * 1.44269504f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.0f ? 0.0f : y * scale;
}

// Per-thread scratch, in floats; the largest of the three phases' needs.
int64_t tile_floats(int64_t d) { return 4 * kBq * d + 4 * kBk * d + 2 * kBq * kBk + 4 * kBq + 256; }

struct Scratch {
  float* base;
  int64_t used = 0;
  float* take(int64_t n) {
    float* p = base + used;
    used += (n + 15) / 16 * 16;
    return p;
  }
};

// The problem with its pointers; offsets are in rows of D elements.
template <typename T>
struct Problem {
  const AttentionArgs& a;
  float scale;
  const T *q, *k, *v, *o, *dout;
  const uint8_t* mask;  // [B, Tk] or null
  int64_t q_row(int64_t bh, int64_t i) const { return (bh * a.tq + i) * a.d; }
  int64_t k_row(int64_t bh, int64_t j) const { return (bh * a.tk + j) * a.d; }
  // Keys [j0, j0 + kBk) seen by query i of batch b (j >= tk is never seen).
  bool visible(int64_t b, int64_t i, int64_t j) const {
    if (j >= a.tk) return false;
    if (mask != nullptr && mask[b * a.tk + j] == 0) return false;
    return a.causal == Causal::no || j <= i + (a.tk - a.tq);
  }
  // Does any query in [i0, i0 + nq) see a key in [j0, ...)? Causal only prunes.
  bool tile_live(int64_t i0, int64_t nq, int64_t j0) const {
    return a.causal == Causal::no || j0 <= i0 + nq - 1 + (a.tk - a.tq);
  }
};

// rows x D of src -> dst, f32 (row-major).
template <typename T>
void load_rows(const T* src, int64_t rows, int64_t d, float* dst) {
  cpu_io::load_n(src, dst, rows * d);
}

// rows x D of src -> dst_t [D, kBk] transposed, columns >= rows zeroed.
template <typename T>
void load_rows_t(const T* src, int64_t rows, int64_t d, float* dst_t) {
  for (int64_t dd = 0; dd < d; ++dd) {
    float* col = dst_t + dd * kBk;
    for (int64_t j = 0; j < kBk; ++j) col[j] = j < rows ? cpu_io::load(src, j * d + dd) : 0.0f;
  }
}

// s [nq, kBk] = scale * a [nq, D] . bt [D, kBk]
void scores(const float* a, const float* bt, int64_t nq, int64_t d, float scale, float* s) {
  for (int64_t i = 0; i < nq; ++i) {
    float acc[kBk] = {};
    for (int64_t dd = 0; dd < d; ++dd) {
      const float ad = a[i * d + dd];
      const float* b = bt + dd * kBk;
#pragma omp simd
      for (int64_t j = 0; j < kBk; ++j) acc[j] += ad * b[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < kBk; ++j) s[i * kBk + j] = acc[j] * scale;
  }
}

// y[0:d] += alpha * x[0:d]
inline void axpy(float alpha, const float* x, float* y, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) y[i] += alpha * x[i];
}

template <typename T>
void forward_tile(const Problem<T>& pb, int64_t bh, int64_t i0, Scratch sc, T* out, float* lse) {
  const AttentionArgs& a = pb.a;
  const int64_t d = a.d, b = bh / a.h, nq = std::min(kBq, a.tq - i0);
  float *qt = sc.take(kBq * d), *kt = sc.take(kBk * d), *vt = sc.take(kBk * d);
  float *s = sc.take(kBq * kBk), *acc = sc.take(kBq * d), *m = sc.take(kBq), *l = sc.take(kBq);
  load_rows(pb.q + pb.q_row(bh, i0), nq, d, qt);
  std::fill(acc, acc + nq * d, 0.0f);
  std::fill(m, m + nq, -INFINITY);
  std::fill(l, l + nq, 0.0f);
  for (int64_t j0 = 0; j0 < a.tk && pb.tile_live(i0, nq, j0); j0 += kBk) {
    const int64_t nk = std::min(kBk, a.tk - j0);
    load_rows_t(pb.k + pb.k_row(bh, j0), nk, d, kt);
    load_rows(pb.v + pb.k_row(bh, j0), nk, d, vt);
    scores(qt, kt, nq, d, pb.scale, s);
    for (int64_t i = 0; i < nq; ++i) {
      float* si = s + i * kBk;
      float mx = m[i];
      for (int64_t j = 0; j < kBk; ++j) {
        if (!pb.visible(b, i0 + i, j0 + j)) si[j] = -INFINITY;
        mx = std::max(mx, si[j]);
      }
      if (mx == -INFINITY) continue;  // nothing visible yet
      const float rescale = exp_neg(m[i] - mx);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < kBk; ++j) {
        si[j] = exp_neg(si[j] - mx);
        sum += si[j];
      }
      l[i] = l[i] * rescale + sum;
      m[i] = mx;
      float* ai = acc + i * d;
      for (int64_t dd = 0; dd < d; ++dd) ai[dd] *= rescale;
      for (int64_t j = 0; j < nk; ++j) axpy(si[j], vt + j * d, ai, d);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* ai = acc + i * d;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int64_t dd = 0; dd < d; ++dd) ai[dd] *= inv;
    cpu_io::store_n(ai, out + pb.q_row(bh, i0 + i), d);
    lse[bh * a.tq + i0 + i] = l[i] > 0.0f ? m[i] + std::log(l[i]) : -INFINITY;
  }
}

// A query tile's backward inputs: Q, dO, lse and Di = rowsum(dO * O).
struct QueryTile {
  float *q, *dout, *lse, *di;
  int64_t i0, nq;
};

template <typename T>
QueryTile load_query_tile(const Problem<T>& pb, int64_t bh, int64_t i0, const float* lse,
                          Scratch& sc) {
  const int64_t d = pb.a.d, nq = std::min(kBq, pb.a.tq - i0);
  QueryTile t{sc.take(kBq * d), sc.take(kBq * d), sc.take(kBq), sc.take(kBq), i0, nq};
  load_rows(pb.q + pb.q_row(bh, i0), nq, d, t.q);
  load_rows(pb.dout + pb.q_row(bh, i0), nq, d, t.dout);
  float orow[1024];  // O, one row at a time (D <= 1024 is checked)
  for (int64_t i = 0; i < nq; ++i) {
    cpu_io::load_n(pb.o + pb.q_row(bh, i0 + i), orow, d);
    float s = 0.0f;
    for (int64_t dd = 0; dd < d; ++dd) s += t.dout[i * d + dd] * orow[dd];
    t.di[i] = s;
    t.lse[i] = lse[bh * pb.a.tq + i0 + i];
  }
  return t;
}

// For one (query tile, key tile): p = P [nq, kBk], ds = dS = P * (dP - Di).
template <typename T>
void probs_and_dscores(const Problem<T>& pb, int64_t b, const QueryTile& qt, int64_t j0,
                       const float* kt, const float* vt_t, float* p, float* ds) {
  const int64_t d = pb.a.d;
  scores(qt.q, kt, qt.nq, d, pb.scale, p);
  scores(qt.dout, vt_t, qt.nq, d, 1.0f, ds);  // dP = dO V^T
  for (int64_t i = 0; i < qt.nq; ++i) {
    float *pi = p + i * kBk, *dsi = ds + i * kBk;
    const float lse = qt.lse[i], di = qt.di[i];
    for (int64_t j = 0; j < kBk; ++j) {
      const bool on = lse != -INFINITY && pb.visible(b, qt.i0 + i, j0 + j);
      pi[j] = on ? exp_neg(pi[j] - lse) : 0.0f;
      dsi[j] = pi[j] * (dsi[j] - di);
    }
  }
}

// dK, dV for keys [j0, j0 + nk) of (b, h): sums over every query tile.
template <typename T>
void backward_key_tile(const Problem<T>& pb, int64_t bh, int64_t j0, const float* lse, Scratch sc,
                       T* dk, T* dv) {
  const AttentionArgs& a = pb.a;
  const int64_t d = a.d, b = bh / a.h, nk = std::min(kBk, a.tk - j0);
  float *kt = sc.take(kBk * d), *vt = sc.take(kBk * d);
  float *dkt = sc.take(kBk * d), *dvt = sc.take(kBk * d);
  float *p = sc.take(kBq * kBk), *ds = sc.take(kBq * kBk);
  load_rows_t(pb.k + pb.k_row(bh, j0), nk, d, kt);
  load_rows_t(pb.v + pb.k_row(bh, j0), nk, d, vt);
  std::fill(dkt, dkt + nk * d, 0.0f);
  std::fill(dvt, dvt + nk * d, 0.0f);
  for (int64_t i0 = 0; i0 < a.tq; i0 += kBq) {
    if (!pb.tile_live(i0, std::min(kBq, a.tq - i0), j0)) continue;
    Scratch qs = sc;
    const QueryTile qt = load_query_tile(pb, bh, i0, lse, qs);
    probs_and_dscores(pb, b, qt, j0, kt, vt, p, ds);
    for (int64_t i = 0; i < qt.nq; ++i) {
      for (int64_t j = 0; j < nk; ++j) {
        axpy(p[i * kBk + j], qt.dout + i * d, dvt + j * d, d);
        axpy(ds[i * kBk + j], qt.q + i * d, dkt + j * d, d);
      }
    }
  }
  for (int64_t i = 0; i < nk * d; ++i) dkt[i] *= pb.scale;
  cpu_io::store_n(dkt, dk + pb.k_row(bh, j0), nk * d);
  cpu_io::store_n(dvt, dv + pb.k_row(bh, j0), nk * d);
}

// dQ for queries [i0, i0 + nq) of (b, h): sums over every key tile.
template <typename T>
void backward_query_tile(const Problem<T>& pb, int64_t bh, int64_t i0, const float* lse, Scratch sc,
                         T* dq) {
  const AttentionArgs& a = pb.a;
  const int64_t d = a.d, b = bh / a.h;
  const QueryTile qt = load_query_tile(pb, bh, i0, lse, sc);
  float *kt = sc.take(kBk * d), *vt = sc.take(kBk * d), *kr = sc.take(kBk * d);
  float *p = sc.take(kBq * kBk), *ds = sc.take(kBq * kBk), *dqt = sc.take(kBq * d);
  std::fill(dqt, dqt + qt.nq * d, 0.0f);
  for (int64_t j0 = 0; j0 < a.tk && pb.tile_live(i0, qt.nq, j0); j0 += kBk) {
    const int64_t nk = std::min(kBk, a.tk - j0);
    load_rows_t(pb.k + pb.k_row(bh, j0), nk, d, kt);
    load_rows_t(pb.v + pb.k_row(bh, j0), nk, d, vt);
    load_rows(pb.k + pb.k_row(bh, j0), nk, d, kr);
    probs_and_dscores(pb, b, qt, j0, kt, vt, p, ds);
    for (int64_t i = 0; i < qt.nq; ++i) {
      for (int64_t j = 0; j < nk; ++j) axpy(ds[i * kBk + j], kr + j * d, dqt + i * d, d);
    }
  }
  for (int64_t i = 0; i < qt.nq * d; ++i) dqt[i] *= pb.scale;
  cpu_io::store_n(dqt, dq + pb.q_row(bh, i0), qt.nq * d);
}

// Runs task(t, scratch) for t in [0, tasks) on as many threads as have a slot.
template <typename Task>
void run_tasks(int64_t tasks, int64_t d, Workspace ws, Task&& task) {
  const size_t slot = static_cast<size_t>(tile_floats(d)) * sizeof(float);
  const int slots = static_cast<int>(std::min<size_t>(ws.bytes / slot, 1 << 16));
  DTRAIN_CHECK(slots >= 1, "attention: workspace {} bytes, need at least {}", ws.bytes, slot);
  const int nt = std::min<int>(slots, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < tasks; ++t) {
    const size_t off = static_cast<size_t>(omp_get_thread_num()) * slot;
    task(t, Scratch{reinterpret_cast<float*>(static_cast<char*>(ws.data) + off)});
  }
}

void check_shapes(std::string_view op, const AttentionArgs& a, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& key_mask) {
  DTRAIN_CHECK(a.b > 0 && a.h > 0 && a.tq > 0 && a.tk > 0 && a.d > 0 && a.d <= 1024,
               "{}: bad shape b {} h {} tq {} tk {} d {} (d <= 1024)", op, a.b, a.h, a.tq, a.tk,
               a.d);
  require_dtype(op, "q", q, {DType::f32, DType::f16, DType::bf16});
  require_dtype(op, "k", k, {q.dtype()});
  require_dtype(op, "v", v, {q.dtype()});
  require_numel(op, "q", q, a.b * a.h * a.tq * a.d);
  require_numel(op, "k", k, a.b * a.h * a.tk * a.d);
  require_numel(op, "v", v, a.b * a.h * a.tk * a.d);
  if (key_mask.defined()) {
    require_dtype(op, "key_mask", key_mask, {DType::u8});
    require_numel(op, "key_mask", key_mask, a.b * a.tk);
  }
}

template <typename T>
Problem<T> problem(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const T* o, const T* dout) {
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(a.d));
  return Problem<T>{
      a,           scale, q.data<T>(), k.data<T>(),
      v.data<T>(), o,     dout,        mask.defined() ? mask.data<uint8_t>() : nullptr};
}

int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

}  // namespace

size_t attention_workspace_bytes(const AttentionArgs& args, DType) {
  return static_cast<size_t>(omp_get_max_threads()) * tile_floats(args.d) * sizeof(float) + 64;
}

void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_mask, Tensor& out, Tensor& lse, Workspace ws) {
  constexpr std::string_view op = "attention_forward";
  require_cpu(op, {&q, &k, &v, &key_mask, &out, &lse});
  check_shapes(op, args, q, k, v, key_mask);
  require_dtype(op, "out", out, {q.dtype()});
  require_numel(op, "out", out, q.numel());
  require_dtype(op, "lse", lse, {DType::f32});
  require_numel(op, "lse", lse, args.b * args.h * args.tq);
  cpu_io::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Problem<T> pb = problem<T>(args, q, k, v, key_mask, nullptr, nullptr);
    const int64_t nqt = tiles(args.tq, kBq);
    run_tasks(args.b * args.h * nqt, args.d, ws, [&](int64_t t, Scratch sc) {
      forward_tile(pb, t / nqt, (t % nqt) * kBq, sc, out.data<T>(), lse.data<float>());
    });
  });
}

void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& key_mask, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        Workspace ws) {
  constexpr std::string_view op = "attention_backward";
  require_cpu(op, {&q, &k, &v, &key_mask, &out, &lse, &dout, &dq, &dk, &dv});
  check_shapes(op, args, q, k, v, key_mask);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &dout, &dq}) {
    require_dtype(op, "out/dout/dq", *t, {q.dtype()});
    require_numel(op, "out/dout/dq", *t, q.numel());
  }
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dk, &dv}) {
    require_dtype(op, "dk/dv", *t, {q.dtype()});
    require_numel(op, "dk/dv", *t, k.numel());
  }
  require_dtype(op, "lse", lse, {DType::f32});
  require_numel(op, "lse", lse, args.b * args.h * args.tq);
  cpu_io::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Problem<T> pb = problem<T>(args, q, k, v, key_mask, out.data<T>(), dout.data<T>());
    const float* l = lse.data<float>();
    const int64_t bh = args.b * args.h, nkt = tiles(args.tk, kBk), nqt = tiles(args.tq, kBq);
    run_tasks(bh * nkt, args.d, ws, [&](int64_t t, Scratch sc) {
      backward_key_tile(pb, t / nkt, (t % nkt) * kBk, l, sc, dk.data<T>(), dv.data<T>());
    });
    run_tasks(bh * nqt, args.d, ws, [&](int64_t t, Scratch sc) {
      backward_query_tile(pb, t / nqt, (t % nqt) * kBq, l, sc, dq.data<T>());
    });
  });
}

}  // namespace dtrain::kernels
