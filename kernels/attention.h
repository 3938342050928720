// Scaled dot-product attention, forward and backward, with optional causal and
// key-padding masks. Memory-efficient: keys are processed in tiles with an
// online softmax, so no [Tq, Tk] matrix per (batch, head) is ever stored; the
// row log-sum-exp is saved and backward recomputes the probabilities per tile
// (on the CPU once per (query tile, key tile) pair; workspace per thread is
// O(tile) for forward and O(Tk * D) for backward: one (batch, head)'s keys).
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class Causal : uint8_t { no, yes };

struct AttentionArgs {
  int64_t b = 1, h = 1;           // batch, heads
  int64_t tq = 1, tk = 1, d = 1;  // query tokens, key tokens, head dim
  float scale = 0.0f;             // 0 means 1/sqrt(d)
  Causal causal = Causal::no;     // causal: query i sees keys j <= i + (tk - tq)
  // Dropout on the attention probabilities (BERT's and GPT-2's attn dropout):
  // P[b, h, i, j] is kept iff Philox(seed, stream).uniform(offset + ((b*H + h)*Tq + i)*Tk + j)
  // >= dropout, the element numbering of kernels/dropout.h, and kept ones are
  // scaled by 1/(1 - dropout); the row sums of the softmax are taken before it.
  // Backward redraws the same mask from the same args; nothing is stored.
  float dropout = 0.0f;
  uint64_t seed = 0, stream = 0;
  // Where batch row 0 starts in the stream: a micro-batch whose first sample is the
  // s-th of the step's global batch passes s*H*Tq*Tk, so a sample's mask does not
  // depend on how the global batch is split into ranks and micro-batches.
  uint64_t offset = 0;
  // Tensor parallelism: these h heads are heads [head_first, head_first + h) of
  // heads_total (0: h), and the mask numbering above uses the whole model's heads
  // (b*heads_total + head_first + h for b*H + h), so a rank's heads draw the masks
  // they draw on one rank.
  int64_t heads_total = 0, head_first = 0;
  // The stream word of element (b*h + local head, i, j) = bh, in the numbering above.
  uint64_t dropout_word(int64_t bh, int64_t i, int64_t j) const {
    const int64_t ht = heads_total > 0 ? heads_total : h;
    const int64_t g = (bh / h) * ht + head_first + bh % h;
    return offset + static_cast<uint64_t>((g * tq + i) * tk + j);
  }
};

// CPU: per-thread tiles. CUDA: Di [B, H, Tq] f32 for backward (kernels/cuda/attention.cu).
size_t attention_workspace_bytes(const AttentionArgs& args, DType dtype,
                                 Device device = Device::cpu());

// q [B, H, Tq, D], k/v [B, H, Tk, D] -> out [B, H, Tq, D], lse f32 [B, H, Tq]
// key_mask: u8 [B, Tk], 1 = attend, 0 = padding; may be undefined (no mask).
// A query row that can see no key gets out = 0 and lse = -inf.
void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_mask, Tensor& out, Tensor& lse, Workspace ws);
// -> dq, dk, dv (overwritten), same shapes as q, k, v
void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& key_mask, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        Workspace ws);

}  // namespace dtrain::kernels
