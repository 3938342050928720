// Kernel-table cases for attention: plain and causal, Tq != Tk both ways (rows
// that see no key), key-padding masks incl. a fully masked batch row, several
// key/query tiles (forward and backward), D = 8 / 16 / 33 / 64, explicit scale;
// f32 in grad mode (dQ, dK, dV), bf16 / f16 forward, one bf16 grad case with a
// loose tolerance, and probability dropout (the reference draws the same mask).
#include "harness.h"
#include "kernels/attention.h"
#include "ref/attention.h"

namespace dtrain::test {
namespace {

using kernels::AttentionArgs;
using kernels::Causal;

enum class Mask : uint8_t { none, random, one_row_empty };

struct Spec {
  std::string variant;
  AttentionArgs a;
  Mask mask = Mask::none;
  DType t = DType::f32;
  bool grad = true;
};

AttentionArgs attn(int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d,
                   Causal causal = Causal::no) {
  AttentionArgs a;
  a.b = b, a.h = h, a.tq = tq, a.tk = tk, a.d = d, a.causal = causal;
  return a;
}

// u8 [B, Tk]: about 3/4 of keys kept; with one_row_empty, batch row 1 keeps none.
ArgSpec mask_spec(const Spec& s) {
  ArgSpec m{"key_mask", Shape{s.a.b, s.a.tk}, DType::u8, Init::explicit_values};
  m.differentiable = false;
  for (int64_t b = 0; b < s.a.b; ++b) {
    for (int64_t j = 0; j < s.a.tk; ++j) {
      const bool keep = (j * 7 + b * 3) % 4 != 0 || j == b;
      m.values.push_back(s.mask == Mask::one_row_empty && b == 1 ? 0.0 : keep ? 1.0 : 0.0);
    }
  }
  return m;
}

Tolerance tolerance(DType t) {
  if (t == DType::bf16) return {2e-2, 1e-2};
  if (t == DType::f16) return {3e-3, 2e-3};
  return {2e-5, 2e-5};
}

KernelCase make_case(const Spec& s) {
  const AttentionArgs a = s.a;
  const bool masked = s.mask != Mask::none;
  KernelCase c;
  c.name = fmt::format("attention/{}{}{}/{}/{}x{}x{}x{}x{}", s.variant,
                       a.causal == Causal::yes ? "_causal" : "", masked ? "_mask" : "",
                       dtype_name(s.t), a.b, a.h, a.tq, a.tk, a.d);
  const Shape qs{a.b, a.h, a.tq, a.d}, ks{a.b, a.h, a.tk, a.d};
  c.inputs = {{"q", qs, s.t, Init::uniform, -2.0, 2.0},
              {"k", ks, s.t, Init::uniform, -2.0, 2.0},
              {"v", ks, s.t}};
  if (masked) c.inputs.push_back(mask_spec(s));
  ArgSpec lse{"lse", Shape{a.b, a.h, a.tq}, DType::f32};
  lse.differentiable = false;
  c.outputs = {{"out", qs, s.t}, lse};
  c.workspace_bytes = kernels::attention_workspace_bytes(a, s.t);
  c.workspace_on = [a, t = s.t](Device d) { return kernels::attention_workspace_bytes(a, t, d); };
  c.forward = [a](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace ws) {
    const Tensor mask = in.size() > 3 ? in[3] : Tensor();
    kernels::attention_forward(a, in[0], in[1], in[2], mask, out[0], out[1], ws);
  };
  c.reference = [a](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::attention_forward(a, in[0].data(), in[1].data(), in[2].data(),
                           in.size() > 3 ? in[3].data() : nullptr, out[0].data(), out[1].data());
  };
  if (s.grad) {
    c.backward = [a](const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     kernels::Workspace ws) {
      const Tensor mask = in.size() > 3 ? in[3] : Tensor();
      kernels::attention_backward(a, in[0], in[1], in[2], mask, out[0], out[1], dout[0], din[0],
                                  din[1], din[2], ws);
    };
  }
  c.check_tol = tolerance(s.t);
  c.grad_tol = s.t == DType::f32 ? Tolerance{1e-3, 1e-3} : Tolerance{5e-2, 5e-2};
  c.grad_samples = 32;
  return c;
}

}  // namespace

std::vector<KernelCase> cases_attention() {
  const Causal C = Causal::yes;
  std::vector<Spec> specs = {
      {"plain", attn(2, 2, 7, 9, 8)},
      {"plain", attn(1, 1, 1, 1, 16)},
      {"plain", attn(1, 2, 5, 3, 33)},
      {"causal", attn(2, 1, 9, 9, 16, C)},
      {"tq_lt_tk", attn(1, 2, 5, 11, 8, C)},
      {"tq_gt_tk", attn(2, 1, 11, 5, 8, C)},  // the first 6 rows see no key
      {"mask", attn(3, 2, 6, 70, 8), Mask::one_row_empty},
      {"mask", attn(2, 1, 7, 13, 16, C), Mask::random},
      {"tiles", attn(1, 1, 40, 130, 16, C), Mask::random, DType::f32, false},
      {"tiles", attn(2, 2, 70, 67, 33), Mask::none, DType::f32, false},
      // backward over several query and key tiles, D padded and not
      {"tiles_grad", attn(1, 2, 40, 70, 33, C), Mask::random},
      {"tiles_grad", attn(2, 1, 70, 67, 64)},
  };
  AttentionArgs scaled = attn(1, 2, 6, 8, 16);
  scaled.scale = 0.3f;
  specs.push_back({"scale", scaled});
  // Probability dropout: the reference draws the same Philox mask per element.
  for (AttentionArgs a : {attn(2, 2, 7, 9, 8), attn(1, 2, 40, 70, 33, C)}) {
    a.dropout = 0.25f, a.seed = 7, a.stream = 11;
    specs.push_back({"dropout", a, a.tq == 40 ? Mask::random : Mask::none});
  }
  AttentionArgs shifted = attn(2, 2, 7, 9, 8);  // a later micro-batch's rows of the stream
  shifted.dropout = 0.25f, shifted.seed = 7, shifted.stream = 11,
  shifted.offset = 2 * 2 * 7 * 9 + 5;
  specs.push_back({"dropout_offset", shifted});
  for (DType t : {DType::bf16, DType::f16}) {
    specs.push_back({"plain", attn(2, 2, 7, 9, 8), Mask::none, t, false});
    specs.push_back({"mask", attn(3, 2, 6, 70, 33), Mask::one_row_empty, t, false});
    specs.push_back({"tiles", attn(1, 2, 40, 130, 16, C), Mask::random, t, false});
  }
  specs.push_back({"grad_half", attn(1, 2, 5, 7, 8, C), Mask::random, DType::bf16, true});
  std::vector<KernelCase> cases;
  for (const Spec& s : specs) cases.push_back(make_case(s));
  return cases;
}

}  // namespace dtrain::test
