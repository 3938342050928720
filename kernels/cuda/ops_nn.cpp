// kernels/cuda_ops.h for the row and index families (layer norm, softmax and
// cross-entropy, embedding, dropout): unwraps the (already checked) Tensors
// into raw pointers and sizes and calls the launchers of kernels/cuda/<family>.cuh
// on the device's backend stream. The pointwise families are in ops.cpp.
#include "kernels/cuda/context.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/softmax.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

XentShape xent_shape(const CrossEntropyArgs& a) {
  return {a.rows, a.classes, a.ignore_index, a.label_smoothing};
}
}  // namespace

void layer_norm_forward(const LayerNormArgs& args, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, Tensor& y, Tensor& save_mean, Tensor& save_rstd) {
  launch_layer_norm_forward(
      x.dtype(), args.rows, args.cols, args.eps, x.raw(), static_cast<const float*>(gamma.raw()),
      static_cast<const float*>(beta.raw()), y.raw(), static_cast<float*>(save_mean.raw()),
      static_cast<float*>(save_rstd.raw()), stream_of(x));
}

void layer_norm_backward(const LayerNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  launch_layer_norm_backward(
      x.dtype(), args.rows, args.cols, x.raw(), dy.raw(), static_cast<const float*>(gamma.raw()),
      static_cast<const float*>(save_mean.raw()), static_cast<const float*>(save_rstd.raw()),
      dx.raw(), static_cast<float*>(dgamma.raw()), static_cast<float*>(dbeta.raw()), stream_of(x));
}

void softmax_forward(int64_t rows, int64_t cols, const Tensor& x, Tensor& y) {
  launch_softmax_forward(x.dtype(), rows, cols, x.raw(), y.raw(), stream_of(x));
}

void softmax_backward(int64_t rows, int64_t cols, const Tensor& y, const Tensor& dy, Tensor& dx) {
  launch_softmax_backward(y.dtype(), rows, cols, y.raw(), dy.raw(), dx.raw(), stream_of(y));
}

void softmax_cross_entropy_forward(const CrossEntropyArgs& args, const Tensor& logits,
                                   const Tensor& targets, Tensor& loss, Tensor& lse) {
  launch_xent_forward(logits.dtype(), xent_shape(args), logits.raw(),
                      static_cast<const int32_t*>(targets.raw()), static_cast<float*>(loss.raw()),
                      static_cast<float*>(lse.raw()), stream_of(logits));
}

void softmax_cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& logits,
                                    const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                                    Tensor& dlogits) {
  launch_xent_backward(logits.dtype(), xent_shape(args), logits.raw(),
                       static_cast<const int32_t*>(targets.raw()), f32(lse), f32(dloss),
                       dlogits.raw(), stream_of(logits));
}

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  launch_embedding_forward(ids.dtype(), ids.raw(), ids.numel(), table.raw(), table.dim(0),
                           table.dim(1), static_cast<int64_t>(dtype_size(table.dtype())), out.raw(),
                           stream_of(table));
}

void labeled_rows(const Tensor& labels, int64_t ignore_index, Tensor& ids, Tensor& out) {
  launch_labeled_rows(static_cast<const int32_t*>(labels.raw()), labels.dim(0), labels.dim(1),
                      out.dim(1), static_cast<int32_t>(ignore_index),
                      static_cast<int32_t*>(ids.raw()), static_cast<int32_t*>(out.raw()),
                      stream_of(labels));
}

void padding_mask(const Tensor& ids, int32_t pad_id, Tensor& mask) {
  launch_padding_mask(static_cast<const int32_t*>(ids.raw()), ids.numel(), pad_id,
                      static_cast<uint8_t*>(mask.raw()), stream_of(ids));
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  launch_embedding_backward(ids.dtype(), ids.raw(), ids.numel(), dout.dtype(), dtable.dtype(),
                            dout.raw(), dtable.dim(0), dtable.dim(1), dtable.raw(),
                            stream_of(dtable));
}

void dropout_forward(const DropoutArgs& args, const Tensor& x, Tensor& y, Tensor& mask) {
  launch_dropout_forward(x.dtype(), {args.p, args.seed, args.stream, args.offset}, x.raw(),
                         x.numel(), y.raw(), static_cast<uint8_t*>(mask.raw()), stream_of(x));
}

void dropout_backward(const DropoutArgs& args, const Tensor& dy, const Tensor& mask, Tensor& dx) {
  launch_dropout_backward(dy.dtype(), args.p, dy.raw(), static_cast<const uint8_t*>(mask.raw()),
                          dy.numel(), dx.raw(), stream_of(dy));
}

}  // namespace dtrain::kernels::cuda_ops
