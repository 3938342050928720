// CUDA GEMM through cuBLASLt, with kernels/gemm.h's semantics. cuBLASLt is
// column-major, and a row-major X is the column-major X^T, so C = op(A) op(B)
// is computed as C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B (same trans
// flag) and its "B" our A, with m and n swapped; no data moves. Batch strides
// go into the layouts (stride 0 broadcasts one matrix). f32 inputs compute in
// CUBLAS_COMPUTE_32F (TF32 only for MathMode::tf32), half inputs in f32 with
// tensor cores; alpha and beta are f32 host scalars, and with beta == 0
// cuBLASLt does not read C. One plan (descriptors + heuristic's algorithm) per
// shape, dtype, workspace size and operand alignment, cached for the process.
// Epilogue::bias: cuBLASLt's BIAS epilogue adds a vector along the rows of its
// column-major output, which are our columns, so bias[n] lands on every row.
// Epilogue::bias_gelu: GELU_AUX_BIAS, the pre-activation going to the aux buffer
// (leading dimension n, like C); when the heuristic has no algorithm for that
// epilogue, the plan falls back to BIAS into pre plus our GELU kernel into C.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

struct Plan {
  bool gelu_fallback = false;  // bias_gelu as BIAS into pre, then our GELU kernel
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A)
  cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      DTRAIN_CHECK(false, "gemm: no cuBLASLt type for {}", dtype_name(t));
  }
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing p.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

int64_t batch_stride(int64_t stride, int64_t matrix) { return stride < 0 ? matrix : stride; }

cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), rows));
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof(count)));
    DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
              uint32_t value) {
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
}

struct Operands {
  const void* a;
  const void* b;
  void* c;
  const void* bias;  // null without an epilogue
  void* pre;         // null without Epilogue::bias_gelu
};

// cuBLASLt's GELU_AUX_BIAS needs the aux leading dimension (our n) divisible by 8
// (cublasLt.h) and, like every operand, a 16-byte aligned pointer; other shapes take
// the fallback up front rather than relying on the heuristic to refuse them.
bool gelu_aux_ok(const GemmArgs& g, const Operands& o) {
  return g.n % 8 == 0 && alignment(o.pre) >= 16 && alignment(o.c) >= 16;
}

// The algorithm for plan->op on these layouts, or false when cuBLASLt has none.
bool find_algo(Context& ctx, Plan& plan, const Operands& o, size_t ws_bytes, const std::string& key,
               bool may_fail);

Plan* make_plan(Context& ctx, const GemmArgs& g, DType ab, DType ct, const Operands& o,
                size_t ws_bytes, const std::string& key, bool gelu_epilogue = true) {
  if (g.epilogue == Epilogue::bias_gelu && gelu_epilogue && !gelu_aux_ok(g, o)) {
    Plan* fallback = make_plan(ctx, g, ab, ct, o, ws_bytes, key, false);
    fallback->gelu_fallback = true;
    return fallback;
  }
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = (ab == DType::f32 && g.math == MathMode::tf32)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_b == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  DTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Column-major shapes as stored: our B is [k, n] row-major = n x k column-major (k x n if
  // transposed); our A is [m, k] = k x m (m x k if transposed); C^T is n x m.
  const bool tb_yes = g.trans_b == Trans::yes, ta_yes = g.trans_a == Trans::yes;
  plan->a = layout(ab, tb_yes ? g.k : g.n, tb_yes ? g.n : g.k, g.batch,
                   batch_stride(g.stride_b, g.k * g.n));
  plan->b = layout(ab, ta_yes ? g.m : g.k, ta_yes ? g.k : g.m, g.batch,
                   batch_stride(g.stride_a, g.m * g.k));
  plan->c = layout(ct, g.n, g.m, g.batch, batch_stride(g.stride_c, g.m * g.n));
  if (g.epilogue != Epilogue::none) {
    const bool gelu = g.epilogue == Epilogue::bias_gelu && gelu_epilogue;
    DTRAIN_CHECK(!gelu || gelu_aux_ok(g, o), "gemm: GELU_AUX_BIAS planned for an unfit shape");
    const cublasLtEpilogue_t epi = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = cuda_type(ct);
    DTRAIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    // The heuristic looks at the pointer's alignment; each call sets its own pointer.
    DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &o.bias, sizeof(o.bias)));
    if (gelu) {
      const int64_t ld = g.n;  // aux is laid out like C: n x m column-major
      DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &o.pre, sizeof(o.pre)));
      DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
      // The aux type stays at its default (C's type): setting it is for fp8 kernels, and
      // an unsupported combination would fail in cublasLtMatmul, not in the heuristic.
    }
  }
  const bool may_fail = g.epilogue == Epilogue::bias_gelu && gelu_epilogue;
  if (!find_algo(ctx, *plan, o, ws_bytes, key, may_fail)) {
    // No GELU_AUX_BIAS algorithm for this shape: the same GEMM with BIAS, then our kernel.
    DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan->op));
    for (cublasLtMatrixLayout_t l : {plan->a, plan->b, plan->c})
      DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l));
    Plan* fallback = make_plan(ctx, g, ab, ct, o, ws_bytes, key, false);
    fallback->gelu_fallback = true;
    return fallback;
  }
  return plan.release();  // cached for the process, like the contexts
}

bool find_algo(Context& ctx, Plan& plan, const Operands& o, size_t ws_bytes, const std::string& key,
               bool may_fail) {
  cublasLtMatmulPreference_t pref = nullptr;
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_ws = ws_bytes;
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(o.b));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(o.a));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(o.c));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(o.c));
  if (o.pre)
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
             std::min(alignment(o.c), alignment(o.pre)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      ctx.lt(), plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && may_fail) return false;
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw Error(fmt::format("gemm on cuda:{}: cuBLASLt has no algorithm for {} ({}, {} "
                            "workspace bytes)",
                            ctx.device(), key, cublasGetStatusString(st), ws_bytes),
                "give gemm the workspace gemm_workspace_bytes() asks for");
  }
  plan.algo = result.algo;
  return true;
}

std::string plan_key(int device, const GemmArgs& g, DType ab, DType c, const Operands& o,
                     size_t ws) {
  return fmt::format(
      "cuda:{} [batch {} m {} n {} k {} trans {}{} strides {},{},{} {}/{} math {} "
      "ws {} align {},{},{},{},{} epilogue {}]",
      device, g.batch, g.m, g.n, g.k, g.trans_a == Trans::yes ? 'T' : 'N',
      g.trans_b == Trans::yes ? 'T' : 'N', g.stride_a, g.stride_b, g.stride_c, dtype_name(ab),
      dtype_name(c), static_cast<int>(g.math), ws, alignment(o.a), alignment(o.b), alignment(o.c),
      alignment(o.bias), alignment(o.pre), static_cast<int>(g.epilogue));
}

const Plan& plan_for(Context& ctx, const GemmArgs& g, DType ab, DType c, const Operands& o,
                     size_t ws) {
  static std::mutex mu;
  static std::map<std::string, Plan*> plans;
  const std::string key = plan_key(ctx.device(), g, ab, c, o, ws);
  std::lock_guard lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(ctx, g, ab, c, o, ws, key)).first;
  return *it->second;
}

}  // namespace

// Called by kernels::gemm after its checks, with m, n, batch > 0.
void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c, Workspace ws,
          const Tensor& bias, const Tensor& pre) {
  Context& ctx = Context::get(a.device().index);
  constexpr int64_t kMax = int64_t{1} << 31;
  DTRAIN_CHECK(args.m < kMax && args.n < kMax && args.k < kMax && args.batch < kMax,
               "gemm on CUDA: sizes must fit in 32 bits (m {} n {} k {} batch {})", args.m, args.n,
               args.k, args.batch);
  if (args.k == 0) {  // an empty product: C = beta * C
    launch_scale_batches(c.dtype(), c.raw(), args.batch, args.m * args.n,
                         batch_stride(args.stride_c, args.m * args.n), args.beta, ctx.stream());
    if (args.epilogue == Epilogue::bias) {
      DTRAIN_CHECK(args.batch == 1 || args.stride_c < 0 || args.stride_c == args.m * args.n,
                   "gemm on CUDA: k == 0 with a bias needs dense C batches");
      bias_add({args.batch * args.m, args.n, 1}, c, bias, c);
    } else if (args.epilogue == Epilogue::bias_gelu) {  // pre = 0 + bias, c = gelu(pre)
      Tensor z = pre;
      bias_add({args.m, args.n, 1}, c, bias, z);
      cuda_ops::activation_forward(Activation::gelu_tanh, z, c);
    }
    return;
  }
  const Operands o{a.raw(), b.raw(), c.raw(), bias.defined() ? bias.raw() : nullptr,
                   pre.defined() ? pre.raw() : nullptr};
  const Plan& plan = plan_for(ctx, args, a.dtype(), c.dtype(), o, ws.bytes);
  const float alpha = args.alpha, beta = args.beta;
  // The bias pointer lives in the cached descriptor: set it and run under one lock.
  static std::mutex bias_mu;
  std::unique_lock<std::mutex> lock(bias_mu, std::defer_lock);
  // With the GELU fallback the GEMM writes the pre-activation, and our kernel C.
  void* out = plan.gelu_fallback ? o.pre : o.c;
  if (args.epilogue != Epilogue::none) {
    lock.lock();
    DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &o.bias, sizeof(o.bias)));
    if (args.epilogue == Epilogue::bias_gelu && !plan.gelu_fallback) {
      DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &o.pre, sizeof(o.pre)));
    }
  }
  DTRAIN_CUBLAS_CHECK(cublasLtMatmul(ctx.lt(), plan.op, &alpha, o.b, plan.a, o.a, plan.b, &beta,
                                     out, plan.c, out, plan.c, &plan.algo, ws.data, ws.bytes,
                                     ctx.stream()));
  if (plan.gelu_fallback) cuda_ops::activation_forward(Activation::gelu_tanh, pre, c);
}

}  // namespace dtrain::kernels::cuda_ops
