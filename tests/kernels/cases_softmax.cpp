// Kernel-table cases for kernels/softmax.h: softmax (odd shapes, +-80 inputs
// for stability, f32/f16/bf16, grad in f32) and softmax cross-entropy (classes
// 1/3/1000, ignore-index rows, all rows ignored, label smoothing 0.1, half
// logits, an out-of-range target that must raise Error, grad in f32).
#include "kernels/softmax.h"

#include <cmath>
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/memory.h"

#include "pointwise_case_util.h"
#include "ref/softmax.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;

KernelCase softmax_case(DType dt, int64_t rows, int64_t cols, double range, const char* variant) {
  KernelCase c;
  const Shape s{rows, cols};
  c.name = "softmax/" + std::string(variant) + "/" + dname(dt) + "/" + shape_tag(s);
  c.inputs = {{"x", s, dt, Init::uniform, -range, range}};
  c.outputs = {{"y", s, dt}};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::softmax_forward(rows, cols, in[0], out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::softmax(rows, cols, in[0].data(), out[0].data());
  };
  if (dt == DType::f32 && rows * cols <= 512) {
    c.backward = [=](const std::vector<Tensor>&, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                     Workspace) { kernels::softmax_backward(rows, cols, out[0], dout[0], din[0]); };
  }
  c.check_tol = tol_for(dt, {1e-7, 2e-5});
  return c;
}

// The backward kernel on its own (half storage): dx = y (dy - sum dy y).
KernelCase softmax_backward_case(DType dt, int64_t rows, int64_t cols) {
  KernelCase c;
  const Shape s{rows, cols};
  c.name = "softmax/backward/" + dname(dt) + "/" + shape_tag(s);
  c.inputs = {{"y", s, dt, Init::uniform, 0.0, 0.2}, {"dy", s, dt}};
  c.outputs = {{"dx", s, dt}};
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::softmax_backward(rows, cols, in[0], in[1], out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::softmax_backward(rows, cols, in[0].data(), in[1].data(), out[0].data());
  };
  c.check_tol = tol_for(dt, {1e-6, 1e-5});
  return c;
}

struct Xent {
  const char* variant;
  int64_t rows, classes;
  int64_t ignore_index = -100;
  float smoothing = 0.0f;
  double target_lo = 0;  // targets uniform integers in [target_lo, classes) unless `targets`
  Values targets;
  Values logits;  // given values (-inf: masked classes); empty: uniform in [-3, 3)
};

kernels::CrossEntropyArgs kernel_args(const Xent& x) {
  return {x.rows, x.classes, x.ignore_index, x.smoothing};
}

ref::CrossEntropy ref_args(const Xent& x) {
  return {x.rows, x.classes, x.ignore_index, static_cast<double>(x.smoothing)};
}

KernelCase xent_case(const Xent& x, DType dt) {
  KernelCase c;
  const Shape s{x.rows, x.classes};
  c.name = "softmax/xent_" + std::string(x.variant) + "/" + dname(dt) + "/" + shape_tag(s);
  ArgSpec targets{"targets",      Shape{x.rows}, DType::i32,
                  Init::integers, x.target_lo,   static_cast<double>(x.classes)};
  targets.differentiable = false;
  if (!x.targets.empty()) {
    targets.init = Init::explicit_values;
    targets.values = x.targets;
  }
  c.inputs = {{"logits", s, dt, Init::uniform, -3.0, 3.0}, targets};
  if (!x.logits.empty()) {
    c.inputs[0].init = Init::explicit_values;
    c.inputs[0].values = x.logits;
  }
  c.outputs = {{"loss", Shape{1}, DType::f32}, {"lse", Shape{x.rows}, DType::f32}};
  c.outputs[1].differentiable = false;
  const auto ka = kernel_args(x);
  const auto ra = ref_args(x);
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::softmax_cross_entropy_forward(ka, in[0], in[1], out[0], out[1]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::cross_entropy(ra, in[0].data(), in[1].data(), out[0].data(), out[1].data());
  };
  if (dt == DType::f32 && x.logits.empty()) {  // no finite differences at -inf
    c.backward = [=](const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                     const std::vector<Tensor>& dout, std::vector<Tensor>& din, Workspace) {
      kernels::softmax_cross_entropy_backward(ka, in[0], in[1], out[1], dout[0], din[0]);
    };
  }
  c.check_tol = {1e-5, 1e-5};
  return c;
}

// The backward kernel on half logits, dloss = 1.5, against the analytic reference.
// over_logits: dlogits written over the logits themselves, as the graph's loss op may
// (grad_in_place 0).
KernelCase xent_backward_case(const Xent& x, DType dt, bool over_logits = false) {
  KernelCase c = xent_case(x, dt);
  c.name = "softmax/xent_backward_" + std::string(x.variant) + (over_logits ? "_in_place" : "") +
           "/" + dname(dt) + "/" + shape_tag(Shape{x.rows, x.classes});
  c.outputs = {{"dlogits", Shape{x.rows, x.classes}, dt}};
  c.backward = nullptr;
  const auto ka = kernel_args(x);
  const auto ra = ref_args(x);
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    Tensor loss = empty_on(in[0], Shape{1}, DType::f32);
    Tensor lse = empty_on(in[0], Shape{x.rows}, DType::f32);
    kernels::softmax_cross_entropy_forward(ka, in[0], in[1], loss, lse);
    Tensor dloss = empty_on(in[0], Shape{1}, DType::f32);
    kernels::fill(dloss, 1.5f);
    if (over_logits) {
      kernels::copy(in[0], out[0]);
      kernels::softmax_cross_entropy_backward(ka, out[0], in[1], lse, dloss, out[0]);
      return;
    }
    kernels::softmax_cross_entropy_backward(ka, in[0], in[1], lse, dloss, out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::cross_entropy_backward(ra, in[0].data(), in[1].data(), 1.5, out[0].data());
  };
  c.check_tol = tol_for(dt, {1e-6, 1e-5});
  return c;
}

// Target 5 at row 2 with 3 classes: forward must throw an Error naming both
// (on CUDA: make the loss NaN).
// Output 1 = threw the right Error, 0 = did not.
KernelCase xent_bad_target_case() {
  KernelCase c;
  c.name = "softmax/xent_bad_target/f32/4x3";
  ArgSpec targets{"targets", Shape{4}, DType::i32, Init::explicit_values};
  targets.values = {0, 2, 5, 1};
  targets.differentiable = false;
  c.inputs = {{"logits", Shape{4, 3}}, targets};
  c.outputs = {{"threw", Shape{1}, DType::f32}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    Tensor loss = empty_on(in[0], Shape{1}, DType::f32),
           lse = empty_on(in[0], Shape{4}, DType::f32);
    if (in[0].device().is_cuda()) {  // targets stay on the device there: the loss is NaN instead
      kernels::softmax_cross_entropy_forward({4, 3}, in[0], in[1], loss, lse);
      kernels::fill(out[0], std::isnan(scalar(loss)) ? 1.0f : 0.0f);
      return;
    }
    float ok = 0.0f;
    try {
      kernels::softmax_cross_entropy_forward({4, 3}, in[0], in[1], loss, lse);
    } catch (const Error& e) {
      const std::string m = e.what();
      ok = m.find("row 2") != std::string::npos && m.find("5") != std::string::npos ? 1.0f : 0.0f;
    }
    out[0].data<float>()[0] = ok;
  };
  c.reference = [](const std::vector<Values>&, std::vector<Values>& out) { out[0][0] = 1.0; };
  return c;
}

// Masked classes: -inf logits (every 7th class from 3, never a target) beside finite ones,
// 3 rows of 40 (two whole vectors and a tail).
Xent masked() {
  Xent x{"masked", 3, 40};
  x.targets = {0, 5, 39};
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t j = 0; j < x.classes; ++j)
      x.logits.push_back(j % 7 == 3 ? -std::numeric_limits<double>::infinity()
                                    : 3.0 * std::sin(static_cast<double>(r * x.classes + j)));
  return x;
}

std::vector<Xent> xent_variants() {
  std::vector<Xent> v;
  v.push_back({"plain", 1, 1});
  v.push_back({"plain", 5, 3});
  v.push_back({"plain", 4, 1000});
  v.push_back({"ignore", 17, 7, -1, 0.0f, -1});  // some rows have target -1 = ignore_index
  v.push_back({"all_ignored", 3, 5, -100, 0.0f, 0, {-100, -100, -100}});
  v.push_back({"smooth", 6, 9, -100, 0.1f});
  v.push_back({"smooth_ignore", 9, 33, 0, 0.1f, 0});  // target 0 is the ignore index here
  v.push_back({"edges", 4, 11, -100, 0.0f, 0, {0, 10, 10, 0}});
  // Rows longer than the CPU kernel's 1024-float blocks: three blocks and a tail that
  // is not a whole vector, the targets in the last block.
  v.push_back({"blocks", 3, 2500, -100, 0.1f});
  v.push_back({"late_target", 4, 2100, -100, 0.0f, 2048});
  v.push_back(masked());
  return v;
}

}  // namespace

std::vector<KernelCase> cases_softmax() {
  std::vector<KernelCase> cases;
  for (DType dt : kFloatTypes) {
    cases.push_back(softmax_case(dt, 1, 1, 3.0, "plain"));
    cases.push_back(softmax_case(dt, 3, 7, 3.0, "plain"));
    cases.push_back(softmax_case(dt, 17, 130, 3.0, "plain"));
    cases.push_back(softmax_case(dt, 4, 1000, 3.0, "plain"));
    cases.push_back(softmax_case(dt, 5, 33, 80.0, "large"));
    cases.push_back(softmax_backward_case(dt, 7, 65));
  }
  for (const Xent& x : xent_variants()) {
    for (DType dt : kFloatTypes) cases.push_back(xent_case(x, dt));
  }
  for (DType dt : {DType::f16, DType::bf16}) {
    cases.push_back(xent_backward_case({"smooth_ignore", 9, 33, 0, 0.1f, 0}, dt));
    cases.push_back(xent_backward_case({"plain", 3, 1000}, dt));
  }
  for (DType dt : kFloatTypes) {
    cases.push_back(xent_backward_case({"blocks", 3, 2500, -100, 0.1f}, dt));
    cases.push_back(xent_backward_case({"late_target", 4, 2100, -100, 0.0f, 2048}, dt));
    cases.push_back(xent_backward_case({"blocks", 3, 2500, -100, 0.1f}, dt, true));
    cases.push_back(xent_backward_case(masked(), dt));
  }
  cases.push_back(xent_bad_target_case());
  return cases;
}

}  // namespace dtrain::test
