// Kernel-table cases for GEMM: every transpose pair, odd sizes, batches with
// custom strides and broadcast operands, alpha / beta, and f16 / bf16 inputs
// with f32 or half output. Grad cases (f32) differentiate through gemm calls
// per batch (beta = 1 accumulates into a broadcast operand's gradient).
#include <array>

#include "harness.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/memory.h"
#include "ref/activation.h"
#include "ref/gemm.h"

namespace dtrain::test {
namespace {

using kernels::GemmArgs;
using kernels::Trans;

Trans flip(Trans t) { return t == Trans::no ? Trans::yes : Trans::no; }

int64_t span(int64_t batch, int64_t stride, int64_t matrix) {
  return stride < 0 ? batch * matrix : (batch - 1) * stride + matrix;
}
int64_t step(int64_t stride, int64_t matrix) { return stride < 0 ? matrix : stride; }

// One per-batch GEMM of the backward: dst = alpha * op(lhs) op(rhs) (+ dst).
// Operand ids: 0 = A, 1 = B, 2 = dC.
struct BackwardCall {
  GemmArgs args;  // batch 1
  int lhs, rhs, dst;
};

std::vector<BackwardCall> backward_calls(const GemmArgs& g) {
  auto call = [&](Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, int l, int r, int d) {
    GemmArgs a;
    a.trans_a = ta, a.trans_b = tb, a.m = m, a.n = n, a.k = k, a.alpha = g.alpha;
    return BackwardCall{a, l, r, d};
  };
  std::vector<BackwardCall> calls;
  // dA: d op(A) = alpha dC op(B)^T
  if (g.trans_a == Trans::no)
    calls.push_back(call(Trans::no, flip(g.trans_b), g.m, g.k, g.n, 2, 1, 0));
  else
    calls.push_back(call(g.trans_b, Trans::yes, g.k, g.m, g.n, 1, 2, 0));
  // dB: d op(B) = alpha op(A)^T dC
  if (g.trans_b == Trans::no)
    calls.push_back(call(flip(g.trans_a), Trans::no, g.k, g.n, g.m, 0, 2, 1));
  else
    calls.push_back(call(Trans::yes, g.trans_a, g.n, g.k, g.m, 2, 0, 1));
  return calls;
}

struct Spec {
  std::string variant;
  GemmArgs g;
  DType ab = DType::f32, c = DType::f32;
};

size_t workspace_for(const Spec& s, Device device) {
  size_t ws = kernels::gemm_workspace_bytes(s.g, s.ab, s.c, device);
  if (s.ab != DType::f32) return ws;
  for (BackwardCall bc : backward_calls(s.g)) {
    for (float beta : {0.0f, 1.0f}) {
      bc.args.beta = beta;
      ws = std::max(ws, kernels::gemm_workspace_bytes(bc.args, DType::f32, DType::f32, device));
    }
  }
  return ws;
}

// Matrix sizes and batch strides of A, B, C (in elements).
std::array<int64_t, 3> matrices(const GemmArgs& g) { return {g.m * g.k, g.k * g.n, g.m * g.n}; }
std::array<int64_t, 3> strides(const GemmArgs& g) { return {g.stride_a, g.stride_b, g.stride_c}; }

void backward(const GemmArgs& g, const std::vector<Tensor>& in, const std::vector<Tensor>& dout,
              std::vector<Tensor>& din, kernels::Workspace ws) {
  const auto mat = matrices(g);
  const auto str = strides(g);
  const Tensor* operands[3] = {&in[0], &in[1], &dout[0]};
  for (int i = 0; i < 2; ++i) kernels::fill(din[i], 0.0f);  // stride gaps
  for (const BackwardCall& bc : backward_calls(g)) {
    for (int64_t b = 0; b < g.batch; ++b) {
      auto view = [&](const Tensor& t, int id) {
        return t.view(b * step(str[id], mat[id]), Shape{mat[id]});
      };
      GemmArgs a = bc.args;
      a.beta = (str[bc.dst] == 0 && b > 0) ? 1.0f : 0.0f;  // broadcast: sum over batches
      Tensor dst = view(din[bc.dst], bc.dst);
      kernels::gemm(a, view(*operands[bc.lhs], bc.lhs), view(*operands[bc.rhs], bc.rhs), dst, ws);
    }
  }
  if (din.size() > 2 && din[2].defined()) kernels::scale(g.beta, dout[0], din[2]);  // dC_in
}

Tolerance tolerance(DType ab, DType c) {
  if (c == DType::bf16) return {2e-2, 1e-2};
  if (c == DType::f16) return {4e-3, 2e-3};
  if (ab != DType::f32) return {1e-4, 1e-4};
  return {2e-5, 2e-5};
}

KernelCase make_case(const Spec& s, bool grad) {
  const GemmArgs g = s.g;
  const auto mat = matrices(g);
  const auto str = strides(g);
  KernelCase c;
  c.name =
      fmt::format("gemm/{}{}_{}/{}{}/{}x{}x{}x{}", g.trans_a == Trans::yes ? 'T' : 'N',
                  g.trans_b == Trans::yes ? 'T' : 'N', s.variant, dtype_name(s.ab),
                  s.c == s.ab ? "" : fmt::format("_{}", dtype_name(s.c)), g.batch, g.m, g.n, g.k);
  const char* names[3] = {"a", "b", "c_in"};
  const int n_in = g.beta != 0.0f ? 3 : 2;
  for (int i = 0; i < n_in; ++i) {
    c.inputs.push_back({names[i], Shape{span(g.batch, str[i], mat[i])}, i < 2 ? s.ab : s.c});
  }
  const bool has_bias = g.epilogue == kernels::Epilogue::bias;
  if (has_bias) c.inputs.push_back({"bias", Shape{g.n}, s.c});
  c.outputs.push_back({"c", Shape{span(g.batch, str[2], mat[2])}, s.c});
  c.workspace_bytes = workspace_for(s, Device::cpu());
  c.workspace_on = [s](Device d) { return workspace_for(s, d); };
  c.forward = [g, n_in, has_bias](const std::vector<Tensor>& in, std::vector<Tensor>& out,
                                  kernels::Workspace ws) {
    if (n_in > 2) kernels::copy(in[2], out[0]);
    kernels::gemm(g, in[0], in[1], out[0], ws, has_bias ? in.back() : Tensor());
  };
  c.reference = [g, n_in, has_bias](const std::vector<Values>& in, std::vector<Values>& out) {
    if (n_in > 2) out[0] = in[2];
    ref::gemm(g, in[0].data(), in[1].data(), out[0].data());
    if (!has_bias) return;
    // C[b][i][j] += bias[j] (added after the product, like the kernels' epilogues).
    const int64_t stride = g.stride_c < 0 ? g.m * g.n : g.stride_c;
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t i = 0; i < g.m * g.n; ++i) out[0][b * stride + i] += in.back()[i % g.n];
  };
  if (grad) {
    c.backward = [g](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace ws) { backward(g, in, dout, din, ws); };
  }
  c.check_tol = tolerance(s.ab, s.c);
  c.grad_tol = {1e-3, 1e-3};
  return c;
}

// The bias + GELU epilogue (GPT-2's MLP up-projection): outputs C = gelu_tanh(pre)
// and pre = A B + bias, against the fp64 reference of both.
KernelCase gelu_case(GemmArgs g, DType dt) {
  g.epilogue = kernels::Epilogue::bias_gelu;
  KernelCase c;
  c.name = fmt::format("gemm/{}{}_bias_gelu/{}/1x{}x{}x{}", g.trans_a == Trans::yes ? 'T' : 'N',
                       g.trans_b == Trans::yes ? 'T' : 'N', dtype_name(dt), g.m, g.n, g.k);
  c.inputs = {{"a", Shape{g.m * g.k}, dt}, {"b", Shape{g.k * g.n}, dt}, {"bias", Shape{g.n}, dt}};
  c.outputs = {{"c", Shape{g.m * g.n}, dt}, {"pre", Shape{g.m * g.n}, dt}};
  const Spec s{"bias_gelu", g, dt, dt};
  c.workspace_bytes = kernels::gemm_workspace_bytes(g, dt, dt);
  c.workspace_on = [s](Device d) { return kernels::gemm_workspace_bytes(s.g, s.ab, s.c, d); };
  c.forward = [g](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace ws) {
    kernels::gemm(g, in[0], in[1], out[0], ws, in[2], out[1]);
  };
  c.reference = [g](const std::vector<Values>& in, std::vector<Values>& out) {
    GemmArgs plain = g;
    plain.epilogue = kernels::Epilogue::none;
    ref::gemm(plain, in[0].data(), in[1].data(), out[1].data());
    for (int64_t i = 0; i < g.m * g.n; ++i) {
      out[1][i] += in[2][i % g.n];
      out[0][i] = ref::activation(ref::Activation::gelu_tanh, out[1][i]);
    }
  };
  c.check_tol = tolerance(dt, dt);
  return c;
}

GemmArgs dims(int64_t batch, int64_t m, int64_t n, int64_t k, Trans ta = Trans::no,
              Trans tb = Trans::no) {
  GemmArgs g;
  g.batch = batch, g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb;
  return g;
}

}  // namespace

std::vector<KernelCase> cases_gemm() {
  std::vector<KernelCase> cases;
  const Trans T = Trans::yes, N = Trans::no;
  // Every transpose pair, at odd sizes; the small ones also run in grad mode.
  for (Trans ta : {N, T}) {
    for (Trans tb : {N, T}) {
      cases.push_back(make_case({"plain", dims(1, 1, 1, 1, ta, tb)}, true));
      cases.push_back(make_case({"plain", dims(1, 17, 33, 9, ta, tb)}, true));
      cases.push_back(make_case({"plain", dims(1, 65, 130, 7, ta, tb)}, false));
      cases.push_back(make_case({"batched", dims(3, 7, 5, 3, ta, tb)}, true));
    }
  }
  GemmArgs ab = dims(2, 17, 9, 33);
  ab.alpha = 0.5f, ab.beta = -1.5f;
  cases.push_back(make_case({"alpha_beta", ab}, true));
  GemmArgs alpha_only = dims(1, 33, 17, 65, T, N);
  alpha_only.alpha = 2.0f;
  cases.push_back(make_case({"alpha", alpha_only}, true));
  GemmArgs bcast_b = dims(4, 7, 9, 5);
  bcast_b.stride_b = 0;
  cases.push_back(make_case({"bcast_b", bcast_b}, true));
  GemmArgs bcast_a = dims(3, 5, 7, 9, T, T);
  bcast_a.stride_a = 0;
  cases.push_back(make_case({"bcast_a", bcast_a}, true));
  // Batch strides with gaps between matrices (C is read first, so beta != 0).
  GemmArgs strided = dims(3, 5, 6, 7, N, T);
  strided.stride_a = 50, strided.stride_b = 45, strided.stride_c = 31, strided.beta = 1.0f;
  cases.push_back(make_case({"strided", strided}, true));
  // The generation cache's append (runtime/decoder.cpp): 1 x (rows x d) blocks times a
  // broadcast 1 x 1, from blocks of 3 rows into slots of 5 (C read first: beta 1, so the
  // gaps between the blocks must keep their values).
  GemmArgs block_copy = dims(6, 1, 2 * 8, 1);
  block_copy.stride_a = 0, block_copy.stride_b = 3 * 8, block_copy.stride_c = 5 * 8;
  block_copy.beta = 1.0f;
  cases.push_back(make_case({"block_copy", block_copy}, false));
  GemmArgs zero_k = dims(2, 3, 4, 0);
  zero_k.beta = 0.5f;
  cases.push_back(make_case({"k0", zero_k}, false));
  // Half inputs: f32 output, half output, with alpha/beta and broadcast.
  for (DType h : {DType::f16, DType::bf16}) {
    for (DType out : {DType::f32, h}) {
      cases.push_back(make_case({"plain", dims(1, 17, 33, 9), h, out}, false));
      cases.push_back(make_case({"plain", dims(1, 65, 130, 7, T, T), h, out}, false));
      GemmArgs hb = dims(3, 9, 17, 33, N, T);
      hb.stride_b = 0, hb.alpha = 0.5f, hb.beta = 2.0f;
      cases.push_back(make_case({"bcast_b_beta", hb, h, out}, false));
    }
  }
  cases.push_back(make_case({"big", dims(1, 256, 192, 320)}, false));
  // Wide untransposed B (n >= 2304, m >= 128): B is staged transposed (kernels/cpu/gemm.cpp).
  for (Trans ta : {N, T}) {
    cases.push_back(make_case({"wide_b", dims(1, 128, 2305, 5, ta, N)}, false));
  }
  GemmArgs wide_beta = dims(1, 130, 2304, 3);
  wide_beta.alpha = 0.5f, wide_beta.beta = -1.0f;
  cases.push_back(make_case({"wide_b_alpha_beta", wide_beta}, false));
  GemmArgs wide_bcast = dims(2, 128, 2311, 2);
  wide_bcast.stride_b = 0;
  cases.push_back(make_case({"wide_b_bcast", wide_bcast}, false));
  for (DType h : {DType::f16, DType::bf16}) {
    cases.push_back(make_case({"wide_b", dims(1, 129, 2304, 4), h, h}, false));
  }
  // A tall transposed A (m > 16384): C in row blocks of A's columns (kernels/cpu/gemm.cpp),
  // five of them here (4001 or 3278 rows, the last one shorter or not); accumulating into
  // C, with a bias, and in half types.
  for (Trans tb : {N, T})
    cases.push_back(make_case({"tall_a", dims(1, 20001, 5, 3, T, tb)}, false));
  GemmArgs tall_beta = dims(1, 16390, 4, 6, T, N);
  tall_beta.alpha = 0.5f, tall_beta.beta = 1.0f;
  cases.push_back(make_case({"tall_a_alpha_beta", tall_beta}, false));
  for (DType h : {DType::f16, DType::bf16}) {
    for (DType out : {DType::f32, h})
      cases.push_back(make_case({"tall_a", dims(1, 20001, 3, 8, T, N), h, out}, false));
  }
  // The bias epilogue (a linear layer's forward: x . W^T + b), also with beta, batches,
  // half types and an empty product.
  auto with_bias = [](GemmArgs g) {
    g.epilogue = kernels::Epilogue::bias;
    return g;
  };
  cases.push_back(make_case({"bias", with_bias(dims(1, 17, 33, 9, N, T))}, false));
  cases.push_back(make_case({"bias", with_bias(dims(1, 130, 2304, 5))}, false));
  GemmArgs bias_beta = with_bias(dims(3, 7, 5, 3, T, N));
  bias_beta.beta = 0.5f;
  cases.push_back(make_case({"bias_beta", bias_beta}, false));
  GemmArgs bias_k0 = with_bias(dims(2, 3, 4, 0));
  bias_k0.beta = 1.0f;
  cases.push_back(make_case({"bias_k0", bias_k0}, false));
  cases.push_back(make_case({"tall_a_bias", with_bias(dims(1, 16385, 3, 4, T, T))}, false));
  for (DType h : {DType::f16, DType::bf16}) {
    for (DType out : {DType::f32, h}) {
      cases.push_back(make_case({"bias", with_bias(dims(1, 9, 17, 33, N, T)), h, out}, false));
    }
  }
  // bias + GELU: a linear layer's shape (N, T) at an odd size and a GPT-2-like one, and
  // half types; cuBLASLt's GELU epilogue (or its fallback) on CUDA.
  cases.push_back(gelu_case(dims(1, 17, 33, 9, N, T), DType::f32));
  cases.push_back(gelu_case(dims(1, 64, 256, 96, N, T), DType::f32));
  cases.push_back(gelu_case(dims(1, 9, 16, 24, T, N), DType::f32));
  for (DType h : {DType::f16, DType::bf16})
    cases.push_back(gelu_case(dims(1, 32, 64, 48, N, T), h));
  return cases;
}

}  // namespace dtrain::test
