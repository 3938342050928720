// Reference optimizer steps (the spec for kernels/optimizer.h), in fp64 on the
// same f32-rounded step scalars the kernels take, element by element.
#pragma once

#include <cstdint>

#include "ref/common.h"

namespace dtrain::ref {

struct SgdStep {
  double lr = 0, wd = 0, mu = 0;
  int momentum = 0;  // 0 none, 1 heavy ball, 2 Nesterov
};

struct AdamStep {
  double b1 = 0, one_minus_b1 = 0, b2 = 0, one_minus_b2 = 0, bc1 = 1, sqrt_bc2 = 1;
  double eps = 0, lr = 0, wd = 0;
};

// p, momentum updated in place from g (momentum ignored with momentum == 0)
void sgd_step(const SgdStep& k, int64_t n, double* p, const double* g, double* momentum);
// p, m, v updated in place from g
void adamw_step(const AdamStep& k, int64_t n, double* p, const double* g, double* m, double* v);

}  // namespace dtrain::ref
