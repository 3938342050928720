// Kernel-table cases for kernels/layernorm.h: rows 1/3/17, cols 1/7/64, a
// 768-wide pair of rows and 300 columns (a ragged end after a whole chunk), two
// eps values, f32/f16/bf16 x (gamma/beta and dgamma/dbeta f32 for every dtype);
// grad mode (f32) checks dx, dgamma, dbeta; check-mode cases run the backward
// kernel on half types.
#include "kernels/layernorm.h"

#include "pointwise_case_util.h"
#include "ref/layernorm.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;

std::vector<ArgSpec> ln_inputs(DType dt, int64_t rows, int64_t cols) {
  return {{"x", Shape{rows, cols}, dt, Init::uniform, -2.0, 3.0},
          {"gamma", Shape{cols}, DType::f32, Init::uniform, 0.5, 1.5},
          {"beta", Shape{cols}, DType::f32, Init::uniform, -0.5, 0.5}};
}

KernelCase forward_case(DType dt, int64_t rows, int64_t cols, float eps) {
  KernelCase c;
  const kernels::LayerNormArgs args{rows, cols, eps};
  c.name = "layernorm/" + std::string(eps == 1e-5f ? "eps1e-5" : "eps1e-2") + "/" + dname(dt) +
           "/" + shape_tag(Shape{rows, cols});
  c.inputs = ln_inputs(dt, rows, cols);
  c.outputs = {{"y", Shape{rows, cols}, dt},
               {"mean", Shape{rows}, DType::f32},
               {"rstd", Shape{rows}, DType::f32}};
  c.outputs[1].differentiable = c.outputs[2].differentiable = false;
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::layer_norm_forward(args, in[0], in[1], in[2], out[0], out[1], out[2]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::layer_norm(rows, cols, eps, in[0].data(), in[1].data(), in[2].data(), out[0].data(),
                    out[1].data(), out[2].data());
  };
  if (dt == DType::f32 && rows * cols <= 2048) {
    c.backward = [=](const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din, Workspace) {
      kernels::layer_norm_backward(args, in[0], dout[0], in[1], out[1], out[2], din[0], din[1],
                                   din[2]);
    };
  }
  c.check_tol = tol_for(dt, {1e-5, 1e-5});
  return c;
}

// The backward kernel on its own: dy is an input, dx/dgamma/dbeta are outputs.
KernelCase backward_case(DType dt, int64_t rows, int64_t cols) {
  KernelCase c;
  const kernels::LayerNormArgs args{rows, cols, 1e-5f};
  c.name = "layernorm/backward/" + dname(dt) + "/" + shape_tag(Shape{rows, cols});
  c.inputs = ln_inputs(dt, rows, cols);
  c.inputs.push_back({"dy", Shape{rows, cols}, dt});
  c.outputs = {{"dx", Shape{rows, cols}, dt},
               {"dgamma", Shape{cols}, DType::f32},
               {"dbeta", Shape{cols}, DType::f32}};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    Tensor y = empty_on(in[0], Shape{rows, cols}, dt);
    Tensor mean = empty_on(in[0], Shape{rows}, DType::f32),
           rstd = empty_on(in[0], Shape{rows}, DType::f32);
    kernels::layer_norm_forward(args, in[0], in[1], in[2], y, mean, rstd);
    kernels::layer_norm_backward(args, in[0], in[3], in[1], mean, rstd, out[0], out[1], out[2]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::layer_norm_backward(rows, cols, 1e-5, in[0].data(), in[1].data(), in[3].data(),
                             out[0].data(), out[1].data(), out[2].data());
  };
  c.check_tol = tol_for(dt, {2e-5, 2e-5});
  if (dt == DType::bf16) c.check_tol = {4e-2, 2e-2};  // dx cancels terms rounded to 8 bits
  return c;
}

}  // namespace

std::vector<KernelCase> cases_layernorm() {
  std::vector<KernelCase> cases;
  for (DType dt : kFloatTypes) {
    for (int64_t rows : {1, 3, 17}) {
      for (int64_t cols : {1, 7, 64}) cases.push_back(forward_case(dt, rows, cols, 1e-5f));
    }
    cases.push_back(forward_case(dt, 2, 768, 1e-5f));
    cases.push_back(forward_case(dt, 3, 7, 1e-2f));
    cases.push_back(backward_case(dt, 5, 33));
    cases.push_back(backward_case(dt, 2, 768));
    // 300 columns: a full 256-column chunk, then one with a ragged vector at its end.
    cases.push_back(forward_case(dt, 3, 300, 1e-5f));
    cases.push_back(backward_case(dt, 3, 300));
  }
  return cases;
}

}  // namespace dtrain::test
