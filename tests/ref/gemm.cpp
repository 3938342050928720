// fp64 reference GEMM: C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b].
#include "ref/gemm.h"

namespace dtrain::ref {

void gemm(const kernels::GemmArgs& g, const double* a, const double* b, double* c) {
  using kernels::Trans;
  const int64_t sa = g.stride_a < 0 ? g.m * g.k : g.stride_a;
  const int64_t sb = g.stride_b < 0 ? g.k * g.n : g.stride_b;
  const int64_t sc = g.stride_c < 0 ? g.m * g.n : g.stride_c;
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const double* A = a + bi * sa;  // [m, k], or [k, m] if trans_a
    const double* B = b + bi * sb;  // [k, n], or [n, k] if trans_b
    double* C = c + bi * sc;        // [m, n]
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < g.k; ++p) {
          const double aip = g.trans_a == Trans::no ? A[i * g.k + p] : A[p * g.m + i];
          const double bpj = g.trans_b == Trans::no ? B[p * g.n + j] : B[j * g.k + p];
          acc += aip * bpj;
        }
        const double old = g.beta == 0.0f ? 0.0 : C[i * g.n + j];
        C[i * g.n + j] = g.alpha * acc + g.beta * old;
      }
    }
  }
}

}  // namespace dtrain::ref
