// Reference softmax and softmax cross-entropy in fp64 (the spec for
// kernels/softmax.h), with ignore-index and PyTorch-style label smoothing.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

// x [rows, cols] -> y [rows, cols], y = exp(x - max) / sum exp(x - max) per row
void softmax(int64_t rows, int64_t cols, const double* x, double* y);
// y, dy [rows, cols] -> dx = y (dy - sum_j dy_j y_j) per row
void softmax_backward(int64_t rows, int64_t cols, const double* y, const double* dy, double* dx);

struct CrossEntropy {
  int64_t rows = 1, classes = 1;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};
// logits [rows, classes], targets [rows] (integers) -> loss [1] (mean over
// non-ignored rows, 0 if none), lse [rows]
void cross_entropy(const CrossEntropy& a, const double* logits, const double* targets, double* loss,
                   double* lse);
// -> dlogits [rows, classes] = dloss / count (softmax - target distribution); ignored rows 0
void cross_entropy_backward(const CrossEntropy& a, const double* logits, const double* targets,
                            double dloss, double* dlogits);

}  // namespace dtrain::ref
