// Softmax over the last dim, and softmax + cross-entropy fused (numerically
// stable, via the row log-sum-exp), with ignore-index and label smoothing.
// Inputs f32, f16 or bf16; the loss, log-sum-exp and accumulation are f32.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

// x [rows, cols] -> y [rows, cols]
void softmax_forward(int64_t rows, int64_t cols, const Tensor& x, Tensor& y);
// y = softmax output, dy -> dx = y * (dy - sum(dy * y))
void softmax_backward(int64_t rows, int64_t cols, const Tensor& y, const Tensor& dy, Tensor& dx);

struct CrossEntropyArgs {
  int64_t rows = 1, classes = 1;
  int64_t ignore_index = -100;   // rows whose target equals this contribute nothing
  float label_smoothing = 0.0f;  // target distribution (1-eps) one-hot + eps/classes
};

// logits [rows, classes], targets i32 [rows] -> loss f32 [1] = mean over the
// non-ignored rows (0 if all are ignored), lse f32 [rows] saved for backward.
// A target outside [0, classes) that is not ignore_index is a user error (Error)
// on the CPU; on CUDA (targets are not copied to the host) the loss is NaN.
void softmax_cross_entropy_forward(const CrossEntropyArgs& args, const Tensor& logits,
                                   const Tensor& targets, Tensor& loss, Tensor& lse);
// dloss f32 [1] = d(total)/d(loss), on the logits' device (the backward seed stays
// where it was computed: no host round trip) -> dlogits [rows, classes] (overwritten)
void softmax_cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& logits,
                                    const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                                    Tensor& dlogits);

}  // namespace dtrain::kernels
