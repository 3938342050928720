// CPU memory-efficient attention (FlashAttention-style). Forward: one task per
// (b, h) stages the head's K^T and V tiles once, then runs each query tile over
// the key tiles with an online softmax. Backward: one
// task per (b, h) walks every (query tile, key tile) pair once, recomputing
// P = exp(S - lse) and dS = P * (dP - Di) * scale for the pair and feeding dQ, dK
// and dV from them (five tile products per pair, none repeated; P^T and dS^T are
// read with strides where a product needs them, never transposed). Each output
// element is summed by one task in a fixed order: bit-identical for any thread
// count, no atomics. Tiles are f32 with the head dim padded to a multiple of 16
// and multiplied by register-blocked kernels on 16-float vectors (GCC vector
// extensions: zmm with AVX-512, narrower registers otherwise): 6 rows x 4 vectors
// of C in registers, B rows loaded as vectors, A broadcast; S and dP start from
// zero accumulators (no clearing pass). Rows that see their whole key tile skip
// the per-key visibility masks. Dropout draws the Philox words of a whole query
// tile in one call (its rows are consecutive in the stream) and tests them as
// integers inside the softmax passes (w >= keep_min, the same bits as the float
// test). Tasks are scheduled statically (contiguous (b, h) runs per thread) and
// each forward task prefetches the next (b, h)'s rows into L2. Workspace:
// per-thread f32 tiles and dropout words, plus for backward the (b, h) slice's
// K, V, dK, dV.
#include "kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/cpu/exp_neg.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cpu/vec16.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {
namespace {

constexpr int64_t kBq = 64;  // query rows per tile
constexpr int64_t kBk = 64;  // keys per tile
using vec::exp_neg;
using vec::exp_neg_v;
using vec::exp_neg_vt;
using vec::kV;
using vec::splat;
using vec::v16;
using vec::v16i;
using vec::vload;
using vec::vstore;
inline v16i vloadi(const int32_t* p) {
  v16i v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Horizontal sum and max as a tree of halvings (4 dependent steps, not 15: they
// sit on each row's critical path).
using v8 = float __attribute__((vector_size(8 * sizeof(float))));
using v4 = float __attribute__((vector_size(4 * sizeof(float))));
inline float hsum(v16 v) {
  const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 b =
      __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
inline float hmax(v16 v) {
  const v8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const v8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v8 a = lo > hi ? lo : hi;
  return std::max(std::max(std::max(a[0], a[4]), std::max(a[1], a[5])),
                  std::max(std::max(a[2], a[6]), std::max(a[3], a[7])));
}

// hsum / hmax of a 16-lane vector given as its halves (lanes 0-7, 8-15): the same tree.
inline float hsum_halves(v8 lo, v8 hi) {
  const v8 a = lo + hi;
  const v4 b =
      __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
inline float hmax_halves(v8 lo, v8 hi) {
  const v8 a = lo > hi ? lo : hi;
  return std::max(std::max(std::max(a[0], a[4]), std::max(a[1], a[5])),
                  std::max(std::max(a[2], a[6]), std::max(a[3], a[7])));
}
inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
using v8m = int32_t __attribute__((vector_size(8 * sizeof(int32_t))));
inline v8m load8m(const int32_t* p) {  // 8 lane masks (-1 seen, 0 not)
  v8m v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

int64_t pad16(int64_t n) { return (n + kV - 1) / kV * kV; }

using v8i = int32_t __attribute__((vector_size(8 * sizeof(int32_t))));
inline v8 exp_neg_v8(v8 x) { return exp_neg_vt<v8, v8i>(x); }

// The tile products' vectors and register block, by what the CPU has. AVX-512: 16-float
// vectors in its 32 zmm registers, 6 rows x 4 vectors of C. Otherwise 8-float vectors
// (one ymm each) in 16 registers, 6 rows x 2 vectors of C beside B's row: GCC's 16-float
// vectors on AVX2 spilled every accumulator (and split stores into xmm pieces) and ran
// attention at 2-3% of the FMA peak. The vectors and the block do not change the order
// of any sum (each element adds over k in order, fused multiply-adds either way): the
// same bits.
#if defined(__AVX512F__)
using mvec = v16;
constexpr int kL = 16;
constexpr int kMaxNV = 4;
template <int NV>
constexpr int kRowsOf = NV >= 3 ? 6 : 8;
#else
using mvec = float __attribute__((vector_size(8 * sizeof(float))));
constexpr int kL = 8;
constexpr int kMaxNV = 2;
template <int NV>
constexpr int kRowsOf = NV >= 2 ? 6 : 8;
#endif
inline mvec mload(const float* p) {
  mvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void mstore(float* p, mvec v) { std::memcpy(p, &v, sizeof v); }

// C[R, NV*kL] (+)= A[R, K] . B[K, NV*kL], A(r, kk) at a[r * sr + kk * sc] (so a
// transposed A costs nothing: its elements are broadcast one at a time anyway),
// row strides ldb, ldc: R * NV accumulators stay in registers while k runs
// (kAcc: they start from C, else from zero and C is only written). kTA: A is
// read transposed (sr = 1, else sc = 1), fixed at compile time so that the k loop
// has one version and the accumulators leave it in registers, not through the stack.
template <int R, int NV, bool kAcc, bool kTA>
void mm_block(const float* a, int64_t sr, int64_t sc, const float* b, int64_t ldb, float* c,
              int64_t ldc, int64_t k) {
  if constexpr (kTA) {
    sr = 1;
  } else {
    sc = 1;
  }
  if (k < 1) __builtin_unreachable();  // callers have k >= 1: no path that skips the loop
  mvec acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAcc ? mload(c + r * ldc + v * kL) : mvec{};
  for (int64_t kk = 0; kk < k; ++kk) {
    mvec bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = mload(b + kk * ldb + v * kL);
    for (int r = 0; r < R; ++r) {
      const float ar = a[r * sr + kk * sc];
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) mstore(c + r * ldc + v * kL, acc[r][v]);
}

// Row blocks of kR (kRowsOf), then 4 / 2 / 1.
template <int NV, bool kAcc, bool kTA>
void mm_rows(const float* a, int64_t sr, int64_t sc, const float* b, int64_t ldb, float* c,
             int64_t ldc, int64_t m, int64_t k) {
  constexpr int kR = kRowsOf<NV>;
  int64_t i = 0;
  for (; i + kR <= m; i += kR)
    mm_block<kR, NV, kAcc, kTA>(a + i * sr, sr, sc, b, ldb, c + i * ldc, ldc, k);
  if (i + 4 <= m) {
    mm_block<4, NV, kAcc, kTA>(a + i * sr, sr, sc, b, ldb, c + i * ldc, ldc, k);
    i += 4;
  }
  if (i + 2 <= m) {
    mm_block<2, NV, kAcc, kTA>(a + i * sr, sr, sc, b, ldb, c + i * ldc, ldc, k);
    i += 2;
  }
  if (i < m) mm_block<1, NV, kAcc, kTA>(a + i * sr, sr, sc, b, ldb, c + i * ldc, ldc, k);
}

// C[m, n] (+)= A[m, k] . B[k, n], A(i, kk) at a[i * sr + kk * sc], n a multiple
// of 16; the sum over k runs in order (from C with kAcc, else from zero).
template <bool kAcc, bool kTA>
void mm(const float* a, int64_t sr, int64_t sc, const float* b, int64_t ldb, float* c, int64_t ldc,
        int64_t m, int64_t k, int64_t n) {
  int64_t j = 0;
  for (; j + kMaxNV * kL <= n; j += kMaxNV * kL)
    mm_rows<kMaxNV, kAcc, kTA>(a, sr, sc, b + j, ldb, c + j, ldc, m, k);
  switch ((n - j) / kL) {
    case 3:
      mm_rows<3, kAcc, kTA>(a, sr, sc, b + j, ldb, c + j, ldc, m, k);
      break;
    case 2:
      mm_rows<2, kAcc, kTA>(a, sr, sc, b + j, ldb, c + j, ldc, m, k);
      break;
    case 1:
      mm_rows<1, kAcc, kTA>(a, sr, sc, b + j, ldb, c + j, ldc, m, k);
      break;
    default:
      break;
  }
}
void mm_acc(const float* a, int64_t sr, int64_t sc, const float* b, int64_t ldb, float* c,
            int64_t ldc, int64_t m, int64_t k, int64_t n) {
  if (sr == 1 && sc != 1) {
    mm<true, true>(a, sr, sc, b, ldb, c, ldc, m, k, n);
  } else {
    DTRAIN_CHECK(sc == 1, "attention mm: A strides {} {}", sr, sc);
    mm<true, false>(a, sr, sc, b, ldb, c, ldc, m, k, n);
  }
}
void mm_set(const float* a, int64_t sr, int64_t sc, const float* b, int64_t ldb, float* c,
            int64_t ldc, int64_t m, int64_t k, int64_t n) {
  DTRAIN_CHECK(sc == 1, "attention mm_set: A strides {} {}", sr, sc);
  mm<false, false>(a, sr, sc, b, ldb, c, ldc, m, k, n);
}

struct Scratch {
  float* base;
  int64_t used = 0;
  float* take(int64_t n) {
    float* p = base + used;
    used += pad16(n);
    return p;
  }
};

// Dropout words of one query tile: kBq rows of tk, plus a tile of slack so the
// vector loads of the last row's last tile stay inside.
int64_t keep_words(int64_t tk) { return kBq * tk + kBk; }

// Floats per thread (a few spare vectors per buffer for the rounding in take()).
int64_t forward_floats(int64_t tk, int64_t dp) {
  const int64_t tkp = (tk + kBk - 1) / kBk * kBk;
  return 2 * tkp * dp + kBk * dp + 2 * kBq * dp + kBq * kBk + 2 * kBq + keep_words(tk) + 10 * kV;
}
int64_t backward_floats(int64_t tk, int64_t dp) {
  const int64_t tkp = (tk + kBk - 1) / kBk * kBk;
  return 5 * tkp * dp + kBk * dp + 3 * kBq * dp + 2 * kBq * kBk + 2 * kBq + keep_words(tk) +
         16 * kV;
}

// The dropout factors of 16 keys from their words: 1/(1-p) kept, 0 dropped; 1
// without dropout. Kept iff u32_to_uniform(w) = (w >> 8) * 2^-24 >= p, i.e.
// w >= min (see keep_min()): the same bits as the float test, no convert. A
// local copy in the loops, so that their float stores cannot alias its fields.
struct KeepTest {
  bool on;
  float scale;
  uint32_t min;
  v16 operator()(const uint32_t* w) const {
    if (!on) return splat(1.0f);
    using v16u = uint32_t __attribute__((vector_size(kV * sizeof(uint32_t))));
    v16u x;
    std::memcpy(&x, w, sizeof x);
    return x >= min ? splat(scale) : v16{};
  }
  v8 half(const uint32_t* w) const {  // 8 lanes of the same test
    if (!on) return v8{} + 1.0f;
    using v8u = uint32_t __attribute__((vector_size(8 * sizeof(uint32_t))));
    v8u x;
    std::memcpy(&x, w, sizeof x);
    return x >= min ? v8{} + scale : v8{};
  }
};

// The problem with its pointers; offsets are in rows of D elements.
template <typename T>
struct Problem {
  const AttentionArgs& a;
  float scale;
  int64_t dp;  // D padded to a multiple of 16
  const T *q, *k, *v, *o, *dout;
  const uint8_t* mask;  // [B, Tk] or null
  float keep_scale;     // 1 / (1 - dropout), once here rather than a divide per vector
  uint32_t keep_min;    // the least Philox word that keeps its element
  int64_t q_row(int64_t bh, int64_t i) const { return (bh * a.tq + i) * a.d; }
  int64_t k_row(int64_t bh, int64_t j) const { return (bh * a.tk + j) * a.d; }
  // Is key j seen by query i of batch b (j >= tk is never seen)?
  bool visible(int64_t b, int64_t i, int64_t j) const {
    if (j >= a.tk) return false;
    if (mask != nullptr && mask[b * a.tk + j] == 0) return false;
    return a.causal == Causal::no || j <= i + (a.tk - a.tq);
  }
  // visible(b, i, j0 + j) for j in [0, kBk) as lane masks (-1 seen, 0 not);
  // without a key mask the visible keys are a prefix, found without a test per key.
  void visible_row(int64_t b, int64_t i, int64_t j0, int32_t* on) const {
    if (mask == nullptr) {
      int64_t end = a.tk;
      if (a.causal == Causal::yes) end = std::min(end, i + (a.tk - a.tq) + 1);
      const int64_t n = std::clamp<int64_t>(end - j0, 0, kBk);
      std::fill(on, on + n, -1);
      std::fill(on + n, on + kBk, 0);
      return;
    }
    for (int64_t j = 0; j < kBk; ++j) on[j] = visible(b, i, j0 + j) ? -1 : 0;
  }
  // Does any query in [i0, i0 + nq) see a key in [j0, ...)? Causal only prunes.
  bool tile_live(int64_t i0, int64_t nq, int64_t j0) const {
    return a.causal == Causal::no || j0 <= i0 + nq - 1 + (a.tk - a.tq);
  }
  // The query rows summed over the live (query tile, key tile) pairs of one (b, h).
  int64_t live_rows() const {
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < a.tq; i0 += kBq) {
      const int64_t nq = std::min(kBq, a.tq - i0);
      n += nq * ((live_end(i0, nq) + kBk - 1) / kBk);
    }
    return n;
  }
  // The end of the keys in live tiles for query rows [i0, i0 + nq).
  int64_t live_end(int64_t i0, int64_t nq) const {
    int64_t j0 = 0;
    while (j0 < a.tk && tile_live(i0, nq, j0)) j0 += kBk;
    return std::min(j0, a.tk);
  }
  // Does query i of batch b see all of keys [j0, j0 + kBk) (no test per key needed)?
  bool row_sees_tile(int64_t i, int64_t j0) const {
    if (mask != nullptr || j0 + kBk > a.tk) return false;
    return a.causal == Causal::no || j0 + kBk - 1 <= i + (a.tk - a.tq);
  }
  // words[i * tk + j] = Philox word of element (query i0 + i of (b, h), key j),
  // for the keys of the live tiles. Without causal pruning the tile's rows are
  // one run of the stream, drawn in one call. A kBk-word slack after the last row
  // keeps the last tile's vector loads inside (their keys are never visible).
  void dropout_tile(int64_t bh, int64_t i0, int64_t nq, uint32_t* words) const {
    if (a.dropout == 0.0f) return;
    const Philox rng(a.seed, a.stream);
    const uint64_t first = a.dropout_word(bh, i0, 0);
    const int64_t end = live_end(i0, nq);
    if (end == a.tk) {
      rng.words(first, nq * a.tk, words);
    } else {
      for (int64_t i = 0; i < nq; ++i)
        rng.words(first + static_cast<uint64_t>(i * a.tk), end, words + i * a.tk);
    }
    std::fill(words + nq * a.tk, words + nq * a.tk + kBk, 0u);
  }
  KeepTest keep_test() const { return {a.dropout > 0.0f, keep_scale, keep_min}; }
};

// Pulls the next (b, h)'s rows into L2 while this one computes (forward only:
// its Q, K, V and O rows), a few lines per query row of each (query tile, key
// tile) pair, so that the prefetches overlap the tile products and the next
// task's loads hit L2 instead of waiting on memory. Static scheduling makes
// bh + 1 the thread's next task except at its chunk's end. (Backward's own rows
// gained nothing from it: its prefetches stalled its softmax passes as long as
// they saved on the loads.)
struct Prefetcher {
  struct Range {
    const char* p;
    int64_t bytes;
    bool write;
  };
  Range r[8];
  int n = 0, cur = 0;
  int64_t off = 0, per_step = 0;
  template <typename T>
  void add(const T* base, int64_t elems, bool write = false) {
    r[n++] = {reinterpret_cast<const char*>(base), elems * static_cast<int64_t>(sizeof(T)), write};
  }
  // Spread the lines over `steps` calls of step().
  void plan(int64_t steps) {
    int64_t lines = 0;
    for (int i = 0; i < n; ++i) lines += (r[i].bytes + 63) / 64;
    per_step = (lines + steps - 1) / std::max<int64_t>(steps, 1);
  }
  void step() {
    for (int64_t k = 0; k < per_step && cur < n; ++k) {
      if (r[cur].write) {
        __builtin_prefetch(r[cur].p + off, 1, 2);
      } else {
        __builtin_prefetch(r[cur].p + off, 0, 2);
      }
      off += 64;
      if (off >= r[cur].bytes) ++cur, off = 0;
    }
  }
};

// rows x D of src -> dst [rows_pad, dp] f32, padding columns and rows zero.
template <typename T>
void load_rows(const T* src, int64_t rows, int64_t rows_pad, int64_t d, int64_t dp, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    cpu_io::load_n(src + r * d, dst + r * dp, d);
    std::fill(dst + r * dp + d, dst + (r + 1) * dp, 0.0f);
  }
  std::fill(dst + rows * dp, dst + rows_pad * dp, 0.0f);
}

// One round of a 16 x 16 transpose on rows (top, bot) = (i, i + B): top keeps
// its columns c with (c & B) == 0 and takes the others from columns c - B of bot;
// bot takes columns c + B of top for the former and keeps the latter.
template <int B>
inline void swap_pair(v16& top, v16& bot) {
  const v16 t = top, b = bot;
  if constexpr (B == 8) {
    top = __builtin_shufflevector(t, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    bot =
        __builtin_shufflevector(t, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  } else if constexpr (B == 4) {
    top = __builtin_shufflevector(t, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    bot = __builtin_shufflevector(t, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  } else if constexpr (B == 2) {
    top = __builtin_shufflevector(t, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    bot = __builtin_shufflevector(t, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  } else if constexpr (B == 1) {
    top = __builtin_shufflevector(t, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    bot = __builtin_shufflevector(t, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
}

// The 16 x 16 block at src (row stride lds) -> dst (row stride ldd), transposed
// in registers: rounds B = 8, 4, 2, 1 swap the off-diagonal B x B sub-blocks of
// each 2B x 2B block, one two-source shuffle per row and round.
void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  v16 r[kV];
  for (int i = 0; i < kV; ++i) r[i] = vload(src + i * lds);
  for (int i = 0; i < 8; ++i) swap_pair<8>(r[i], r[i + 8]);
  for (int i = 0; i < kV; ++i)
    if ((i & 4) == 0) swap_pair<4>(r[i], r[i + 4]);
  for (int i = 0; i < kV; ++i)
    if ((i & 2) == 0) swap_pair<2>(r[i], r[i + 2]);
  for (int i = 0; i < kV; i += 2) swap_pair<1>(r[i], r[i + 1]);
  for (int i = 0; i < kV; ++i) vstore(dst + i * ldd, r[i]);
}

// src [rows, cols] (row stride lds) -> dst [cols, rows] (row stride rows), both
// multiples of 16 (callers pad with zero rows).
void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += kV)
    for (int64_t c0 = 0; c0 < cols; c0 += kV)
      transpose16(src + r0 * lds + c0, lds, dst + c0 * rows + r0, rows);
}

// Forward of one (b, h): K^T and V of every key tile staged once, then each
// query tile runs over the key tiles with an online softmax.
template <typename T>
void forward_head(const Problem<T>& pb, int64_t bh, Scratch sc, T* out, float* lse) {
  const AttentionArgs& a = pb.a;
  const int64_t d = a.d, dp = pb.dp, b = bh / a.h;
  const int64_t nkt = (a.tk + kBk - 1) / kBk, tkp = nkt * kBk;
  float *kt = sc.take(tkp * dp), *vt = sc.take(tkp * dp), *kr = sc.take(kBk * dp);
  float *qt = sc.take(kBq * dp), *acc = sc.take(kBq * dp), *s = sc.take(kBq * kBk);
  float *m = sc.take(kBq), *l = sc.take(kBq);
  uint32_t* words = reinterpret_cast<uint32_t*>(sc.take(keep_words(a.tk)));
  Prefetcher pf;
  if (bh + 1 < a.b * a.h) {
    pf.add(pb.k + pb.k_row(bh + 1, 0), a.tk * d);
    pf.add(pb.v + pb.k_row(bh + 1, 0), a.tk * d);
    pf.add(pb.q + pb.q_row(bh + 1, 0), a.tq * d);
    pf.add(out + pb.q_row(bh + 1, 0), a.tq * d, true);
    pf.plan(pb.live_rows());
  }
  for (int64_t t = 0; t < nkt; ++t) {  // K^T tiles [dp, kBk]; V rows [kBk, dp]
    const int64_t j0 = t * kBk, nk = std::min(kBk, a.tk - j0);
    load_rows(pb.k + pb.k_row(bh, j0), nk, kBk, d, dp, kr);
    transpose(kr, dp, kBk, dp, kt + j0 * dp);
    load_rows(pb.v + pb.k_row(bh, j0), nk, kBk, d, dp, vt + j0 * dp);
  }
  for (int64_t i0 = 0; i0 < a.tq; i0 += kBq) {
    const int64_t nq = std::min(kBq, a.tq - i0);
    load_rows(pb.q + pb.q_row(bh, i0), nq, nq, d, dp, qt);
    pb.dropout_tile(bh, i0, nq, words);
    std::fill(acc, acc + nq * dp, 0.0f);
    std::fill(m, m + nq, -INFINITY);
    std::fill(l, l + nq, 0.0f);
    for (int64_t j0 = 0; j0 < a.tk && pb.tile_live(i0, nq, j0); j0 += kBk) {
      // The keys this tile holds, to a multiple of 16 (a partial last tile computes no
      // more: the columns it drops have P = 0 and zero V rows, whose terms add nothing).
      const int64_t nkp = pad16(std::min(kBk, a.tk - j0));
      mm_set(qt, dp, 1, kt + j0 * dp, kBk, s, kBk, nq, dp, nkp);
      // Two passes over the rows (scaled scores and row maxima, then exp and sums)
      // rather than one per row: each row's max -> exp -> sum is a long chain, and
      // the rows of a pass are independent of one another.
      int32_t on[kBk];
      float mnew[kBq];
      const v16 ninf = splat(-INFINITY);
      const float scale = pb.scale;
      for (int64_t i = 0; i < nq; ++i) {
        pf.step();
        float* si = s + i * kBk;
#if !defined(__AVX512F__)
        // Without AVX-512: each 16-lane vector as two 8-lane halves (lanes 0-7, 8-15),
        // every lane the same operations, and the same reduction tree (hmax8 pairs the
        // halves first, as hmax does): the same bits, without GCC spilling 16-lane
        // temporaries through the stack. Rows with hidden keys (causal, a key mask, the
        // last partial tile) select -inf for them, lane by lane, as the 16-lane path.
        {
          v8 mlo = v8{} + m[i], mhi = mlo;
          if (pb.row_sees_tile(i0 + i, j0)) {
            for (int64_t j = 0; j < kBk; j += kV) {
              const v8 xl = load8(si + j) * scale, xh = load8(si + j + 8) * scale;
              store8(si + j, xl);
              store8(si + j + 8, xh);
              mlo = mlo > xl ? mlo : xl;
              mhi = mhi > xh ? mhi : xh;
            }
          } else {
            pb.visible_row(b, i0 + i, j0, on);
            const v8 ninf8 = v8{} - INFINITY;
            for (int64_t j = 0; j < nkp; j += kV) {
              const v8 xl = load8m(on + j) ? load8(si + j) * scale : ninf8;
              const v8 xh = load8m(on + j + 8) ? load8(si + j + 8) * scale : ninf8;
              store8(si + j, xl);
              store8(si + j + 8, xh);
              mlo = mlo > xl ? mlo : xl;
              mhi = mhi > xh ? mhi : xh;
            }
          }
          mnew[i] = hmax_halves(mlo, mhi);
          continue;
        }
#endif
        v16 mxv = splat(m[i]);
        if (pb.row_sees_tile(i0 + i, j0)) {
          for (int64_t j = 0; j < kBk; j += kV) {
            const v16 x = vload(si + j) * scale;
            vstore(si + j, x);
            mxv = mxv > x ? mxv : x;
          }
        } else {
          pb.visible_row(b, i0 + i, j0, on);
          for (int64_t j = 0; j < nkp; j += kV) {
            const v16 x = vloadi(on + j) ? vload(si + j) * scale : ninf;
            vstore(si + j, x);
            mxv = mxv > x ? mxv : x;
          }
        }
        mnew[i] = hmax(mxv);
      }
      const KeepTest keep = pb.keep_test();
      for (int64_t i = 0; i < nq; ++i) {
        float* si = s + i * kBk;
        const float mx = mnew[i];
        if (mx == -INFINITY) {  // nothing visible yet: this tile adds nothing
          std::fill(si, si + kBk, 0.0f);
          continue;
        }
        const float rescale = exp_neg(m[i] - mx);
        // O sums the dropped probabilities; l is the full softmax sum.
        const uint32_t* wi = words + i * a.tk + j0;
#if !defined(__AVX512F__)
        v8 slo{}, shi{};  // the halves of the 16-lane sum (see the first pass)
        for (int64_t j = 0; j < nkp; j += kV) {
          const v8 el = exp_neg_v8(load8(si + j) - mx), eh = exp_neg_v8(load8(si + j + 8) - mx);
          store8(si + j, el * keep.half(wi + j));
          store8(si + j + 8, eh * keep.half(wi + j + 8));
          slo += el;
          shi += eh;
        }
        l[i] = l[i] * rescale + hsum_halves(slo, shi);
#else
        v16 sumv{};
        for (int64_t j = 0; j < nkp; j += kV) {
          const v16 e = exp_neg_v(vload(si + j) - mx);
          vstore(si + j, e * keep(wi + j));
          sumv += e;
        }
        l[i] = l[i] * rescale + hsum(sumv);
#endif
        m[i] = mx;
        if (rescale != 1.0f) {
          float* ai = acc + i * dp;
          for (int64_t dd = 0; dd < dp; dd += kV) vstore(ai + dd, vload(ai + dd) * rescale);
        }
      }
      mm_acc(s, kBk, 1, vt + j0 * dp, dp, acc, dp, nq, nkp, dp);
    }
    for (int64_t i = 0; i < nq; ++i) {
      float* ai = acc + i * dp;
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      for (int64_t dd = 0; dd < d; ++dd) ai[dd] *= inv;
      cpu_io::store_n(ai, out + pb.q_row(bh, i0 + i), d);
      lse[bh * a.tq + i0 + i] = l[i] > 0.0f ? m[i] + std::log(l[i]) : -INFINITY;
    }
  }
}

// Backward of one (b, h): dQ, dK, dV from every (query tile, key tile) pair.
template <typename T>
void backward_head(const Problem<T>& pb, int64_t bh, const float* lse_all, Scratch sc, T* dq, T* dk,
                   T* dv) {
  const AttentionArgs& a = pb.a;
  const int64_t d = a.d, dp = pb.dp, b = bh / a.h;
  const int64_t nkt = (a.tk + kBk - 1) / kBk, tkp = nkt * kBk;
  // The head's keys: K rows [tkp, dp]; K^T and V^T per key tile [dp, kBk].
  float *kr = sc.take(tkp * dp), *kt = sc.take(tkp * dp), *vt = sc.take(tkp * dp);
  float *dkt = sc.take(tkp * dp), *dvt = sc.take(tkp * dp);
  float *qt = sc.take(kBq * dp), *dot = sc.take(kBq * dp), *dqt = sc.take(kBq * dp);
  float *p = sc.take(kBq * kBk), *ds = sc.take(kBq * kBk), *vrow = sc.take(kBk * dp);
  float *lse = sc.take(kBq), *di = sc.take(kBq);
  uint32_t* words = reinterpret_cast<uint32_t*>(sc.take(keep_words(a.tk)));
  load_rows(pb.k + pb.k_row(bh, 0), a.tk, tkp, d, dp, kr);
  for (int64_t t = 0; t < nkt; ++t) {
    const int64_t j0 = t * kBk, nk = std::min(kBk, a.tk - j0);
    transpose(kr + j0 * dp, dp, kBk, dp, kt + j0 * dp);
    load_rows(pb.v + pb.k_row(bh, j0), nk, kBk, d, dp, vrow);
    transpose(vrow, dp, kBk, dp, vt + j0 * dp);
  }
  std::fill(dkt, dkt + tkp * dp, 0.0f);
  std::fill(dvt, dvt + tkp * dp, 0.0f);
  for (int64_t i0 = 0; i0 < a.tq; i0 += kBq) {
    const int64_t nq = std::min(kBq, a.tq - i0);
    load_rows(pb.q + pb.q_row(bh, i0), nq, nq, d, dp, qt);
    load_rows(pb.dout + pb.q_row(bh, i0), nq, nq, d, dp, dot);
    pb.dropout_tile(bh, i0, nq, words);
    for (int64_t i = 0; i < nq; ++i) {  // Di = rowsum(dO * O)
      float orow[1024];                 // D <= 1024 is checked
      cpu_io::load_n(pb.o + pb.q_row(bh, i0 + i), orow, d);
      std::fill(orow + d, orow + dp, 0.0f);
#if !defined(__AVX512F__)
      v8 slo{}, shi{};  // the 16-lane sum's halves, summed by hsum's tree
      for (int64_t dd = 0; dd < dp; dd += kV) {
        slo += load8(dot + i * dp + dd) * load8(orow + dd);
        shi += load8(dot + i * dp + dd + 8) * load8(orow + dd + 8);
      }
      di[i] = hsum_halves(slo, shi);
#else
      v16 sv{};
      for (int64_t dd = 0; dd < dp; dd += kV) sv += vload(dot + i * dp + dd) * vload(orow + dd);
      di[i] = hsum(sv);
#endif
      lse[i] = lse_all[bh * a.tq + i0 + i];
    }
    std::fill(dqt, dqt + nq * dp, 0.0f);
    for (int64_t j0 = 0; j0 < a.tk && pb.tile_live(i0, nq, j0); j0 += kBk) {
      const int64_t nkp = pad16(std::min(kBk, a.tk - j0));          // as the forward's
      mm_set(qt, dp, 1, kt + j0 * dp, kBk, p, kBk, nq, dp, nkp);    // S = Q K^T
      mm_set(dot, dp, 1, vt + j0 * dp, kBk, ds, kBk, nq, dp, nkp);  // dP = dO V^T
      // With dropout mask M (scaled): O = (P * M) V, so dV = (P * M)^T dO and
      // dP = (dO V^T) * M; dS = P * (dP - Di) with Di = rowsum(dO * O) as before.
      // dS carries the softmax scale here, so dQ and dK need no pass of their own.
      int32_t on[kBk];
      const KeepTest keep = pb.keep_test();
      for (int64_t i = 0; i < nq; ++i) {
        float *pi = p + i * kBk, *dsi = ds + i * kBk;
        const uint32_t* wi = words + i * a.tk + j0;
        const float li = lse[i], dii = di[i], sc = pb.scale;
        if (li != -INFINITY && pb.row_sees_tile(i0 + i, j0)) {
#if !defined(__AVX512F__)
          for (int64_t j = 0; j < kBk; j += 8) {  // 8 lanes at a time, the same per lane
            const v8 prob = exp_neg_v8(load8(pi + j) * sc - li);
            const v8 kj = keep.half(wi + j);
            store8(dsi + j, prob * (load8(dsi + j) * kj - dii) * sc);
            store8(pi + j, prob * kj);
          }
#else
          for (int64_t j = 0; j < kBk; j += kV) {
            const v16 prob = exp_neg_v(vload(pi + j) * sc - li);
            const v16 kj = keep(wi + j);
            vstore(dsi + j, prob * (vload(dsi + j) * kj - dii) * sc);
            vstore(pi + j, prob * kj);
          }
#endif
          continue;
        }
        pb.visible_row(b, i0 + i, j0, on);
        if (li == -INFINITY) std::fill(on, on + kBk, 0);
#if !defined(__AVX512F__)
        for (int64_t j = 0; j < nkp; j += 8) {  // 8 lanes at a time, the same per lane
          const v8 e = exp_neg_v8(load8(pi + j) * sc - li);
          const v8 prob = load8m(on + j) ? e : v8{};
          const v8 kj = keep.half(wi + j);
          store8(dsi + j, prob * (load8(dsi + j) * kj - dii) * sc);
          store8(pi + j, prob * kj);
        }
#else
        for (int64_t j = 0; j < nkp; j += kV) {
          const v16 e = exp_neg_v(vload(pi + j) * sc - li);
          const v16 prob = vloadi(on + j) ? e : v16{};
          const v16 kj = keep(wi + j);
          vstore(dsi + j, prob * (vload(dsi + j) * kj - dii) * sc);
          vstore(pi + j, prob * kj);
        }
#endif
      }
      // P^T and dS^T as A operands: element (key r, query kk) at [kk * kBk + r].
      mm_acc(p, 1, kBk, dot, dp, dvt + j0 * dp, dp, nkp, nq, dp);  // dV += P^T dO
      mm_acc(ds, 1, kBk, qt, dp, dkt + j0 * dp, dp, nkp, nq, dp);  // dK += dS^T Q
      mm_acc(ds, kBk, 1, kr + j0 * dp, dp, dqt, dp, nq, nkp, dp);  // dQ += dS K
    }
    for (int64_t i = 0; i < nq; ++i) cpu_io::store_n(dqt + i * dp, dq + pb.q_row(bh, i0 + i), d);
  }
  for (int64_t j = 0; j < a.tk; ++j) {
    cpu_io::store_n(dkt + j * dp, dk + pb.k_row(bh, j), d);
    cpu_io::store_n(dvt + j * dp, dv + pb.k_row(bh, j), d);
  }
}

// Runs task(t, scratch) for t in [0, tasks) on as many threads as have a slot.
template <typename Task>
void run_tasks(int64_t tasks, int64_t slot_floats, Workspace ws, Task&& task) {
  const size_t slot = static_cast<size_t>(slot_floats) * sizeof(float);
  const int slots = static_cast<int>(std::min<size_t>(ws.bytes / slot, 1 << 16));
  DTRAIN_CHECK(slots >= 1, "attention: workspace {} bytes, need at least {}", ws.bytes, slot);
  const int nt = std::min<int>(slots, omp_get_max_threads());
#pragma omp parallel for schedule(static) num_threads(nt)
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
  DTRAIN_CHECK(a.dropout >= 0.0f && a.dropout < 1.0f, "{}: dropout {} is outside [0, 1)", op,
               a.dropout);
  DTRAIN_CHECK(a.heads_total == 0 || (a.head_first >= 0 && a.head_first + a.h <= a.heads_total),
               "{}: heads [{}, {}) of {}", op, a.head_first, a.head_first + a.h, a.heads_total);
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

// The least word w with u32_to_uniform(w) >= p: (w >> 8) * 2^-24 is exact, so
// it is t * 256 for the least integer t >= p * 2^24 (exact too: p < 1, so t <= 2^24 - 1).
uint32_t keep_min(float p) { return static_cast<uint32_t>(std::ceil(p * 0x1p24f)) << 8; }

template <typename T>
Problem<T> problem(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const T* o, const T* dout) {
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(a.d));
  return Problem<T>{a,
                    scale,
                    pad16(a.d),
                    q.data<T>(),
                    k.data<T>(),
                    v.data<T>(),
                    o,
                    dout,
                    mask.defined() ? mask.data<uint8_t>() : nullptr,
                    1.0f / (1.0f - a.dropout),
                    keep_min(a.dropout)};
}

}  // namespace

size_t attention_workspace_bytes(const AttentionArgs& args, DType, Device device) {
  if (device.is_cuda()) return cuda_ops::attention_workspace_bytes_cuda(args);
  const int64_t dp = pad16(args.d);
  const int64_t slot = std::max(forward_floats(args.tk, dp), backward_floats(args.tk, dp));
  return static_cast<size_t>(omp_get_max_threads()) * slot * sizeof(float) + 64;
}

void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_mask, Tensor& out, Tensor& lse, Workspace ws) {
  constexpr std::string_view op = "attention_forward";
  const Device device = same_device(op, {&q, &k, &v, &key_mask, &out, &lse});
  check_shapes(op, args, q, k, v, key_mask);
  require_dtype(op, "out", out, {q.dtype()});
  require_numel(op, "out", out, q.numel());
  require_dtype(op, "lse", lse, {DType::f32});
  require_numel(op, "lse", lse, args.b * args.h * args.tq);
  if (device.is_cuda()) return cuda_ops::attention_forward(args, q, k, v, key_mask, out, lse);
  cpu_io::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Problem<T> pb = problem<T>(args, q, k, v, key_mask, nullptr, nullptr);
    run_tasks(args.b * args.h, forward_floats(args.tk, pb.dp), ws, [&](int64_t t, Scratch sc) {
      forward_head(pb, t, sc, out.data<T>(), lse.data<float>());
    });
  });
}

void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& key_mask, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        Workspace ws) {
  constexpr std::string_view op = "attention_backward";
  const Device device = same_device(op, {&q, &k, &v, &key_mask, &out, &lse, &dout, &dq, &dk, &dv});
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
  if (device.is_cuda()) {
    return cuda_ops::attention_backward(args, q, k, v, key_mask, out, lse, dout, dq, dk, dv, ws);
  }
  cpu_io::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Problem<T> pb = problem<T>(args, q, k, v, key_mask, out.data<T>(), dout.data<T>());
    const float* l = lse.data<float>();
    run_tasks(args.b * args.h, backward_floats(args.tk, pb.dp), ws, [&](int64_t t, Scratch sc) {
      backward_head(pb, t, l, sc, dq.data<T>(), dk.data<T>(), dv.data<T>());
    });
  });
}

}  // namespace dtrain::kernels
