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

// Vocabulary-parallel cross-entropy (tensor parallelism; CPU only): this rank's logits
// are classes [first, first + args.classes) of `total`, and args.rows rows. The ranks'
// partial results meet in two all-reduces the caller makes between the calls: the row
// maxima (max), then the row sums (sum). Targets are checked against `total`.
struct ClassShare {
  int64_t first = 0, total = 0;
};
// -> row_max f32 [rows]: the max of this rank's logits of each row.
void cross_entropy_row_max(const CrossEntropyArgs& args, const Tensor& logits, Tensor& row_max);
// row_max: every rank's maximum -> sums f32 [rows, 3]: sum_j exp(x_j - max), the
// target's logit (0 where another rank holds it) and sum_j x_j, over this rank's classes.
void cross_entropy_row_sums(const CrossEntropyArgs& args, const ClassShare& share,
                            const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            Tensor& sums);
// sums: every rank's, added -> loss f32 [1] and lse f32 [rows] as
// softmax_cross_entropy_forward computes them over all the classes.
void cross_entropy_finish(const CrossEntropyArgs& args, const ClassShare& share,
                          const Tensor& targets, const Tensor& row_max, const Tensor& sums,
                          Tensor& loss, Tensor& lse);
// softmax_cross_entropy_backward's dlogits for this rank's classes.
void cross_entropy_share_backward(const CrossEntropyArgs& args, const ClassShare& share,
                                  const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& dloss, Tensor& dlogits);

}  // namespace dtrain::kernels
