// Host launchers of kernels/cuda/attention.cu: scaled dot-product attention,
// forward and backward, with causal and key-padding masks, the semantics of
// kernels/attention.h, including dropout on the probabilities drawn from the
// CPU's Philox stream (the same mask as the CPU kernel).
// Raw device pointers; q/k/v/out/dq/dk/dv in `dtype`, lse and the workspace f32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtrain::kernels::cuda_ops {

struct AttnShape {
  int64_t b, h, tq, tk, d;
  float scale;    // already resolved (1/sqrt(d) when the caller passed 0)
  bool causal;    // query i sees keys j <= i + (tk - tq)
  float dropout;  // 0: none; else P_ij kept iff uniform(((b*H + h)*Tq + i)*Tk + j) >= dropout
  uint64_t seed, stream;
  uint64_t offset;                  // added to every element's word index (AttentionArgs::offset)
  int64_t heads_total, head_first;  // AttentionArgs' (heads_total already resolved: >= h)
};

// q [B,H,Tq,D], k/v [B,H,Tk,D], key_mask u8 [B,Tk] or null -> out [B,H,Tq,D], lse [B,H,Tq]
void launch_attention_forward(DType dtype, const AttnShape& s, const void* q, const void* k,
                              const void* v, const uint8_t* key_mask, void* out, float* lse,
                              cudaStream_t stream);
// -> dq, dk, dv (overwritten); `rowdot` holds B*H*Tq floats of workspace.
void launch_attention_backward(DType dtype, const AttnShape& s, const void* q, const void* k,
                               const void* v, const uint8_t* key_mask, const void* out,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv,
                               float* rowdot, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda_ops
