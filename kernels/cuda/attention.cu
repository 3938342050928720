// CUDA attention, memory-efficient: one warp per query row (forward, dQ) or per
// key row (dK, dV); keys (or queries) are visited in chunks of 32, one per lane,
// with an online softmax, so nothing of size Tq x Tk is ever stored. Each lane
// owns head dims lane, lane + 32, ... of its row's output. Backward recomputes
// P = exp(S * scale - lse) and dS = P * (dP - Di), Di = rowsum(dO * O): a first
// kernel writes Di and dQ, a second dK and dV; every output element is summed by
// one warp in a fixed order (no atomics: bit-identical run to run). Plain FP32
// maths on CUDA cores: correct and general (D <= 1024), not yet tensor-core fast.
// Dropout multiplies P by M (0 or 1/(1-p), from philox.cuh's copy of the CPU
// stream) in O and dV, and dP by M, while l and lse stay the full softmax sums.
#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/philox.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDims = 1024 / kWarp;  // head dims per lane (D <= 1024)
constexpr unsigned kAll = 0xffffffffu;

__device__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kAll, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kAll, v, o);
  return v;
}

__device__ bool visible(const AttnShape& s, const uint8_t* mask, int64_t b, int64_t i, int64_t j) {
  if (j >= s.tk) return false;
  if (mask != nullptr && mask[b * s.tk + j] == 0) return false;
  return !s.causal || j <= i + (s.tk - s.tq);
}

// M_ij: the dropout multiplier of probability (bh, i, j), as the CPU draws it.
__device__ float keep_of(const AttnShape& s, int64_t bh, int64_t i, int64_t j) {
  if (s.dropout == 0.0f) return 1.0f;
  const int64_t g = (bh / s.h) * s.heads_total + s.head_first + bh % s.h;  // the model's head
  const auto n = s.offset + static_cast<uint64_t>((g * s.tq + i) * s.tk + j);
  const philox::Words w = philox::block(s.seed, s.stream, n / 4);
  return philox::u32_to_uniform(w.w[n % 4]) >= s.dropout ? 1.0f / (1.0f - s.dropout) : 0.0f;
}

// dot(x[row_x], y[row_y]) over D, each row D contiguous elements.
template <typename T>
__device__ float dot_rows(const T* x, const T* y, int64_t d) {
  float acc = 0.0f;
  for (int64_t t = 0; t < d; ++t) acc += load(x, t) * load(y, t);
  return acc;
}

template <typename T>
__global__ void forward_kernel(AttnShape s, const T* q, const T* k, const T* v, const uint8_t* mask,
                               T* out, float* lse) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= s.b * s.h * s.tq) return;  // whole warps leave together
  const int64_t bh = row / s.tq, i = row % s.tq, b = bh / s.h;
  const T* qi = q + row * s.d;
  float acc[kMaxDims];
  for (int t = 0; t < kMaxDims; ++t) acc[t] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 < s.tk; j0 += kWarp) {
    const int64_t j = j0 + lane;
    const bool on = visible(s, mask, b, i, j);
    const float sj = on ? dot_rows(qi, k + (bh * s.tk + j) * s.d, s.d) * s.scale : -INFINITY;
    const float mx = fmaxf(m, warp_max(sj));
    if (mx == -INFINITY) continue;  // nothing visible yet
    const float p = on ? expf(sj - mx) : 0.0f;
    const float pk = on ? p * keep_of(s, bh, i, j) : 0.0f;  // O sums the dropped probabilities
    const float rescale = expf(m - mx);
    l = l * rescale + warp_sum(p);
    m = mx;
    for (int t = 0; t < kMaxDims; ++t) acc[t] *= rescale;
    for (int src = 0; src < kWarp && j0 + src < s.tk; ++src) {
      const float ps = __shfl_sync(kAll, pk, src);
      if (ps == 0.0f) continue;
      const T* vj = v + (bh * s.tk + j0 + src) * s.d;
      for (int t = 0; t < kMaxDims; ++t) {
        const int64_t dd = lane + static_cast<int64_t>(t) * kWarp;
        if (dd < s.d) acc[t] += ps * load(vj, dd);
      }
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int t = 0; t < kMaxDims; ++t) {
    const int64_t dd = lane + static_cast<int64_t>(t) * kWarp;
    if (dd < s.d) store(out, row * s.d + dd, acc[t] * inv);
  }
  if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// Per query row: Di = rowsum(dO * O), then dQ = scale * sum_j dS_ij k_j.
template <typename T>
__global__ void backward_dq_kernel(AttnShape s, const T* q, const T* k, const T* v,
                                   const uint8_t* mask, const T* o, const float* lse, const T* dout,
                                   T* dq, float* rowdot) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= s.b * s.h * s.tq) return;
  const int64_t bh = row / s.tq, i = row % s.tq, b = bh / s.h;
  const T *qi = q + row * s.d, *doi = dout + row * s.d, *oi = o + row * s.d;
  float part = 0.0f;
  for (int64_t dd = lane; dd < s.d; dd += kWarp) part += load(doi, dd) * load(oi, dd);
  const float di = warp_sum(part);
  if (lane == 0) rowdot[row] = di;
  const float li = lse[row];
  float acc[kMaxDims];
  for (int t = 0; t < kMaxDims; ++t) acc[t] = 0.0f;
  for (int64_t j0 = 0; j0 < s.tk && li != -INFINITY; j0 += kWarp) {
    const int64_t j = j0 + lane;
    float ds = 0.0f;
    if (visible(s, mask, b, i, j)) {
      const T* kj = k + (bh * s.tk + j) * s.d;
      const float p = expf(dot_rows(qi, kj, s.d) * s.scale - li);
      const float dp = dot_rows(doi, v + (bh * s.tk + j) * s.d, s.d) * keep_of(s, bh, i, j);
      ds = p * (dp - di);
    }
    for (int src = 0; src < kWarp && j0 + src < s.tk; ++src) {
      const float dss = __shfl_sync(kAll, ds, src);
      if (dss == 0.0f) continue;
      const T* kj = k + (bh * s.tk + j0 + src) * s.d;
      for (int t = 0; t < kMaxDims; ++t) {
        const int64_t dd = lane + static_cast<int64_t>(t) * kWarp;
        if (dd < s.d) acc[t] += dss * load(kj, dd);
      }
    }
  }
  for (int t = 0; t < kMaxDims; ++t) {
    const int64_t dd = lane + static_cast<int64_t>(t) * kWarp;
    if (dd < s.d) store(dq, row * s.d + dd, acc[t] * s.scale);
  }
}

// Per key row: dV = sum_i P_ij dO_i, dK = scale * sum_i dS_ij q_i.
template <typename T>
__global__ void backward_dkv_kernel(AttnShape s, const T* q, const T* k, const T* v,
                                    const uint8_t* mask, const float* lse, const T* dout,
                                    const float* rowdot, T* dk, T* dv) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= s.b * s.h * s.tk) return;
  const int64_t bh = row / s.tk, j = row % s.tk, b = bh / s.h;
  const T *kj = k + row * s.d, *vj = v + row * s.d;
  float acc_k[kMaxDims], acc_v[kMaxDims];
  for (int t = 0; t < kMaxDims; ++t) acc_k[t] = acc_v[t] = 0.0f;
  for (int64_t i0 = 0; i0 < s.tq; i0 += kWarp) {
    const int64_t i = i0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (i < s.tq && lse[bh * s.tq + i] != -INFINITY && visible(s, mask, b, i, j)) {
      const int64_t qrow = bh * s.tq + i;
      const float keep = keep_of(s, bh, i, j);
      const float prob = expf(dot_rows(q + qrow * s.d, kj, s.d) * s.scale - lse[qrow]);
      ds = prob * (dot_rows(dout + qrow * s.d, vj, s.d) * keep - rowdot[qrow]);
      p = prob * keep;  // dV sums the dropped probabilities
    }
    for (int src = 0; src < kWarp && i0 + src < s.tq; ++src) {
      const float ps = __shfl_sync(kAll, p, src), dss = __shfl_sync(kAll, ds, src);
      if (ps == 0.0f && dss == 0.0f) continue;
      const int64_t qrow = bh * s.tq + i0 + src;
      for (int t = 0; t < kMaxDims; ++t) {
        const int64_t dd = lane + static_cast<int64_t>(t) * kWarp;
        if (dd >= s.d) continue;
        acc_v[t] += ps * load(dout + qrow * s.d, dd);
        acc_k[t] += dss * load(q + qrow * s.d, dd);
      }
    }
  }
  for (int t = 0; t < kMaxDims; ++t) {
    const int64_t dd = lane + static_cast<int64_t>(t) * kWarp;
    if (dd >= s.d) continue;
    store(dk, row * s.d + dd, acc_k[t] * s.scale);
    store(dv, row * s.d + dd, acc_v[t]);
  }
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void launch_attention_forward(DType dtype, const AttnShape& s, const void* q, const void* k,
                              const void* v, const uint8_t* key_mask, void* out, float* lse,
                              cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<blocks_for(s.b * s.h * s.tq), kWarpsPerBlock * kWarp, 0, stream>>>(
        s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), key_mask,
        static_cast<T*>(out), lse);
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void launch_attention_backward(DType dtype, const AttnShape& s, const void* q, const void* k,
                               const void* v, const uint8_t* key_mask, const void* out,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv,
                               float* rowdot, cudaStream_t stream) {
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *qt = static_cast<const T*>(q), *kt = static_cast<const T*>(k),
            *vt = static_cast<const T*>(v), *dot = static_cast<const T*>(dout);
    backward_dq_kernel<T><<<blocks_for(s.b * s.h * s.tq), kWarpsPerBlock * kWarp, 0, stream>>>(
        s, qt, kt, vt, key_mask, static_cast<const T*>(out), lse, dot, static_cast<T*>(dq), rowdot);
    DTRAIN_CUDA_CHECK_LAUNCH();
    backward_dkv_kernel<T><<<blocks_for(s.b * s.h * s.tk), kWarpsPerBlock * kWarp, 0, stream>>>(
        s, qt, kt, vt, key_mask, lse, dot, rowdot, static_cast<T*>(dk), static_cast<T*>(dv));
    DTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dtrain::kernels::cuda_ops
