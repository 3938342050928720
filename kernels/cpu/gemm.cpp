// CPU GEMM through oneDNN matmul: transposes and batch strides (0 = broadcast)
// become strided memory descriptors, alpha an output scale, beta a sum
// post-op. bf16 runs natively (f32 accumulation) where oneDNN has a bf16 path on this
// CPU (AVX-512); f16, which oneDNN 2.6 lacks on CPU, and bf16 elsewhere (an AVX2-only
// CPU) are widened to dense f32 copies in the workspace and rounded back.
// Does not handle k == 0 through oneDNN (C = beta * C is done here).
// A wide untransposed B (row-major [k, n], n >= 2304) is staged transposed: oneDNN
// 2.6's brgemm runs such "NN"/"TN" products at 120-200 GF/s on this Zen 5 against
// 240-300 GF/s for the same product with B transposed (BERT/GPT-2's MLP
// down-projection backward: m 1024 n 3072 k 768 went from 133 to 259 GF/s with the
// copy included); narrower B gains nothing and is passed as it is.
// A tall transposed A (one matrix, m > 16384: a large vocabulary's weight gradient,
// m 50257 n 768 k 512 for GPT-2's head) is multiplied in blocks of about 4096 rows of
// C, each a strided view of A: oneDNN 2.6 ran the whole bf16 product at 0.49-0.68
// TFLOP/s on this Zen 5 (2 threads), 4096-row blocks at 0.79 (8192: 0.81, for twice
// the scratchpad, 48 MiB against 24; bench_gemm --trans TN --c same); GPT-2 124M's bf16
// head went from 184 to 155 ms a step, its fp32 one stayed at 290.
#include "kernels/gemm.h"

#include "kernels/activation.h"
#include "kernels/cpu/dense_dnnl.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {
namespace {

using namespace dnnl_util;
constexpr std::string_view kOp = "gemm";

struct GemmPlan {
  Pass pass;
};

std::string describe(const GemmArgs& g, DType ab, DType c) {
  return fmt::format(
      "[batch {} m {} n {} k {} trans {}{} alpha {} beta {} strides {},{},{} {}/{}{}]", g.batch,
      g.m, g.n, g.k, g.trans_a == Trans::yes ? 'T' : 'N', g.trans_b == Trans::yes ? 'T' : 'N',
      g.alpha, g.beta, g.stride_a, g.stride_b, g.stride_c, dtype_name(ab), dtype_name(c),
      g.epilogue == Epilogue::bias        ? " +bias"
      : g.epilogue == Epilogue::bias_gelu ? " +bias gelu"
                                          : "");
}

// A [batch, rows, cols] operand as stored by the caller, viewed as the logical
// [batch', rows', cols'] matrix oneDNN multiplies (transposed by strides).
// `ld`: for a transposed operand, the stored matrix's row length when it is wider than
// `rows` (a block of its columns); 0: `rows`.
md user_md(int64_t batch, int64_t stride, int64_t rows, int64_t cols, Trans t, dt type,
           int64_t ld = 0) {
  const int64_t b = (stride == 0) ? 1 : batch;
  const int64_t bs = (stride <= 0 || b == 1) ? rows * cols : stride;
  if (t == Trans::no) return md({b, rows, cols}, type, dnnl::memory::dims{bs, cols, 1});
  const int64_t lead = ld > 0 ? ld : rows;
  return md({b, rows, cols}, type, dnnl::memory::dims{b == 1 ? lead * cols : bs, 1, lead});
}

// Row blocks of C for a tall transposed A (see the top of the file): the rows per block,
// or 0 when the product runs whole. Not for operands widened to f32 (f16; bf16 without
// AVX-512): their copy wants a dense A.
constexpr int64_t kRowBlock = 4096, kTallRows = 16384;
int64_t row_block(const GemmArgs& g, DType ab) {
  const dt t = to_dnnl(ab);
  if (g.batch != 1 || g.trans_a != Trans::yes || g.m <= kTallRows || compute_type(t) != t) return 0;
  const int64_t blocks = (g.m + kRowBlock - 1) / kRowBlock;
  return (g.m + blocks - 1) / blocks;
}

// The primitive's view: the same dims, dense f32 when the caller's type is widened.
md prim_md(const md& user) {
  if (compute_type(user.data_type()) == user.data_type()) return user;
  return md(user.dims(), dt::f32, dnnl::memory::format_tag::abc);
}

// Whether B is staged as a dense transposed copy (see the top of the file): one
// untransposed matrix (not batched), wide enough that brgemm's NN path is slow
// and enough rows of A that the copy is a small share of the product.
bool stage_b_transposed(const GemmArgs& g) {
  const bool one_b = g.batch == 1 || g.stride_b == 0;
  return one_b && g.trans_b == Trans::no && g.n >= 2304 && g.m >= 128;
}

// B [1, k, n] stored column-major: each of the n columns is k contiguous values.
md transposed_md(const md& user) {
  const dnnl::memory::dims d = user.dims();
  const dt type = compute_type(user.data_type());
  return md(d, type, dnnl::memory::dims{d[1] * d[2], 1, d[1]});
}

// lda: A's stored row length for a block of its columns (0: m).
GemmPlan make_plan(const GemmArgs& g, DType ab, DType c, int64_t lda) {
  const dt tab = to_dnnl(ab), tc = to_dnnl(c);
  const md a_user = user_md(g.batch, g.stride_a, g.m, g.k, g.trans_a, tab, lda);
  const md b_user = user_md(g.batch, g.stride_b, g.k, g.n, g.trans_b, tab);
  const md c_user = user_md(g.batch, g.stride_c, g.m, g.n, Trans::no, tc);
  const md a_prim = prim_md(a_user), c_prim = prim_md(c_user);
  const md b_prim = stage_b_transposed(g) ? transposed_md(b_user) : prim_md(b_user);
  dnnl::primitive_attr attr = user_scratchpad_attr();
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(g.beta);
    attr.set_post_ops(po);
  }
  const ArgDir c_dir = g.beta != 0.0f ? ArgDir::inout : ArgDir::out;
  if (g.epilogue == Epilogue::bias) {  // bias [1, 1, n], broadcast over batch and rows
    const md bias_user({1, 1, g.n}, tc, dnnl::memory::dims{g.n, g.n, 1});
    const md bias_prim = prim_md(bias_user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_prim, b_prim, bias_prim, c_prim), attr,
                                    cpu_engine());
    return GemmPlan{make_pass(dnnl::matmul(pd), pd.scratchpad_desc(),
                              {{DNNL_ARG_SRC, ArgDir::in, a_user, a_prim},
                               {DNNL_ARG_WEIGHTS, ArgDir::in, b_user, b_prim},
                               {DNNL_ARG_DST, c_dir, c_user, c_prim},
                               {DNNL_ARG_BIAS, ArgDir::in, bias_user, bias_prim}})};
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_prim, b_prim, c_prim), attr, cpu_engine());
  return GemmPlan{make_pass(dnnl::matmul(pd), pd.scratchpad_desc(),
                            {{DNNL_ARG_SRC, ArgDir::in, a_user, a_prim},
                             {DNNL_ARG_WEIGHTS, ArgDir::in, b_user, b_prim},
                             {DNNL_ARG_DST, c_dir, c_user, c_prim}})};
}

const GemmPlan& plan_for(const GemmArgs& g, DType ab, DType c, int64_t lda = 0) {
  static Cache<GemmPlan> cache;
  const std::string key = describe(g, ab, c) + (lda > 0 ? fmt::format(" lda {}", lda) : "");
  return guarded(kOp, key, [&]() -> const GemmPlan& {
    return cache.get(key, [&] { return make_plan(g, ab, c, lda); });
  });
}

// fn(args of the block, first row) for each row block of C (row_block), or once.
template <typename Fn>
void for_row_blocks(const GemmArgs& g, DType ab, Fn&& fn) {
  const int64_t rows = row_block(g, ab);
  if (rows == 0) return fn(g, int64_t{0});
  for (int64_t r0 = 0; r0 < g.m; r0 += rows) {
    GemmArgs part = g;
    part.m = std::min(rows, g.m - r0);
    fn(part, r0);
  }
}

int64_t span(int64_t batch, int64_t stride, int64_t matrix) {
  if (stride < 0) return batch * matrix;
  return (batch - 1) * stride + matrix;
}

// k == 0: the product is empty, so C = beta * C.
template <typename T>
void scale_c(const GemmArgs& g, T* c) {
  const int64_t stride = g.stride_c < 0 ? g.m * g.n : g.stride_c;
  for (int64_t b = 0; b < g.batch; ++b) {
    T* cb = c + b * stride;
    for (int64_t i = 0; i < g.m * g.n; ++i) {
      cpu_io::store(cb, i, g.beta == 0.0f ? 0.0f : g.beta * cpu_io::load(cb, i));
    }
  }
}

// k == 0 with the bias epilogue: C += bias on every row of every batch.
void add_bias_rows(const GemmArgs& g, const Tensor& bias, Tensor& c) {
  const int64_t stride = g.stride_c < 0 ? g.m * g.n : g.stride_c;
  cpu_io::dispatch_float(c.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* bp = bias.data<T>();
    T* cp = c.data<T>();
    for (int64_t b = 0; b < g.batch; ++b) {
      T* cb = cp + b * stride;
      for (int64_t i = 0; i < g.m * g.n; ++i) {
        cpu_io::store(cb, i, cpu_io::load(cb, i) + cpu_io::load(bp, i % g.n));
      }
    }
  });
}

void check_args(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& c,
                const Tensor& bias, const Tensor& pre) {
  same_device(kOp, {&a, &b, &c, &bias, &pre});
  if (g.epilogue != Epilogue::none) {
    require_dtype(kOp, "bias", bias, {c.dtype()});
    require_numel(kOp, "bias", bias, g.n);
    DTRAIN_CHECK(g.alpha == 1.0f, "gemm: the bias epilogue needs alpha 1, got {}", g.alpha);
  } else {
    DTRAIN_CHECK(!bias.defined(), "gemm: a bias tensor without Epilogue::bias");
  }
  if (g.epilogue == Epilogue::bias_gelu) {
    require_dtype(kOp, "pre", pre, {c.dtype()});
    require_numel(kOp, "pre", pre, g.m * g.n);
    DTRAIN_CHECK(g.batch == 1 && g.beta == 0.0f && g.stride_c < 0,
                 "gemm: bias_gelu needs batch 1, beta 0 and a dense C, got {}",
                 describe(g, a.dtype(), c.dtype()));
    DTRAIN_CHECK(pre.raw() != c.raw(), "gemm: bias_gelu's pre and c are one tensor");
  } else {
    DTRAIN_CHECK(!pre.defined(), "gemm: a pre tensor without Epilogue::bias_gelu");
  }
  require_dtype(kOp, "a", a, {DType::f32, DType::f16, DType::bf16});
  require_dtype(kOp, "b", b, {a.dtype()});
  require_dtype(kOp, "c", c, {DType::f32, a.dtype()});
  DTRAIN_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, "gemm: negative size {}",
               describe(g, a.dtype(), c.dtype()));
  DTRAIN_CHECK(g.stride_c != 0 || g.batch <= 1, "gemm: C cannot be broadcast (stride_c 0)");
  const struct {
    const char* name;
    const Tensor& t;
    int64_t need;
  } operands[] = {{"a", a, span(g.batch, g.stride_a, g.m * g.k)},
                  {"b", b, span(g.batch, g.stride_b, g.k * g.n)},
                  {"c", c, span(g.batch, g.stride_c, g.m * g.n)}};
  for (const auto& o : operands) {
    DTRAIN_CHECK(o.t.numel() >= o.need, "gemm: {} has {} elements, {} needs {}", o.name,
                 o.t.numel(), describe(g, a.dtype(), c.dtype()), o.need);
  }
}

}  // namespace

size_t gemm_workspace_bytes(const GemmArgs& args, DType ab_dtype, DType c_dtype, Device device) {
  if (args.m == 0 || args.n == 0 || args.k == 0 || args.batch == 0) return 0;
  if (device.is_cuda()) return cuda_ops::kGemmWorkspaceBytes;
  GemmArgs g = args;  // bias_gelu runs as the bias GEMM, then the activation kernel
  if (g.epilogue == Epilogue::bias_gelu) g.epilogue = Epilogue::bias;
  const int64_t lda = row_block(g, ab_dtype) > 0 ? g.m : 0;
  size_t bytes = 0;
  for_row_blocks(g, ab_dtype, [&](const GemmArgs& part, int64_t) {
    bytes = std::max(bytes, plan_for(part, ab_dtype, c_dtype, lda).pass.workspace_bytes);
  });
  return bytes;
}

void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c, Workspace ws,
          const Tensor& bias, const Tensor& pre) {
  check_args(args, a, b, c, bias, pre);
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  if (a.device().is_cuda()) return cuda_ops::gemm(args, a, b, c, ws, bias, pre);
  if (args.epilogue == Epilogue::bias_gelu) {
    GemmArgs g = args;
    g.epilogue = Epilogue::bias;
    Tensor z = pre;
    gemm(g, a, b, z, ws, bias);
    return activation_forward(Activation::gelu_tanh, z, c);
  }
  if (args.k == 0) {
    cpu_io::dispatch_float(c.dtype(), [&](auto tag) { scale_c(args, c.data<decltype(tag)>()); });
    if (args.epilogue == Epilogue::bias) add_bias_rows(args, bias, c);
    return;
  }
  const int64_t lda = row_block(args, a.dtype()) > 0 ? args.m : 0;
  for_row_blocks(args, a.dtype(), [&](const GemmArgs& part, int64_t r0) {
    const GemmPlan& plan = plan_for(part, a.dtype(), c.dtype(), lda);
    // Block r0: A's columns from r0 (A is stored [k, m]), C's rows from r0.
    const void* ap = static_cast<const char*>(a.raw()) + r0 * dtype_size(a.dtype());
    void* cp = static_cast<char*>(c.raw()) + r0 * args.n * dtype_size(c.dtype());
    guarded(kOp, describe(part, a.dtype(), c.dtype()), [&] {
      if (args.epilogue == Epilogue::bias) {
        run_pass(plan.pass, {ap, b.raw(), cp, bias.raw()}, ws);
      } else {
        run_pass(plan.pass, {ap, b.raw(), cp}, ws);
      }
    });
  });
}

}  // namespace dtrain::kernels
