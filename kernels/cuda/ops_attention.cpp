// kernels/cuda_ops.h for attention: resolves the scale and calls the launchers
// of kernels/cuda/attention.cuh on the device's backend stream.
#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

AttnShape shape_of(const AttentionArgs& a) {
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(a.d));
  return {a.b,
          a.h,
          a.tq,
          a.tk,
          a.d,
          scale,
          a.causal == Causal::yes,
          a.dropout,
          a.seed,
          a.stream,
          a.offset,
          a.heads_total > 0 ? a.heads_total : a.h,
          a.head_first};
}

const uint8_t* mask_of(const Tensor& m) {
  return m.defined() ? static_cast<const uint8_t*>(m.raw()) : nullptr;
}

}  // namespace

void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_mask, Tensor& out, Tensor& lse) {
  const AttnShape s = shape_of(args);
  launch_attention_forward(q.dtype(), s, q.raw(), k.raw(), v.raw(), mask_of(key_mask), out.raw(),
                           static_cast<float*>(lse.raw()), stream_of(q));
}

void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& key_mask, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        Workspace ws) {
  const AttnShape s = shape_of(args);
  const size_t need = attention_workspace_bytes_cuda(args);
  DTRAIN_CHECK(ws.bytes >= need, "attention_backward on CUDA: workspace {} bytes, need {}",
               ws.bytes, need);
  launch_attention_backward(q.dtype(), s, q.raw(), k.raw(), v.raw(), mask_of(key_mask), out.raw(),
                            static_cast<const float*>(lse.raw()), dout.raw(), dq.raw(), dk.raw(),
                            dv.raw(), static_cast<float*>(ws.data), stream_of(q));
}

}  // namespace dtrain::kernels::cuda_ops
