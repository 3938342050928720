// Kernel-table cases for kernels/reduce.h: sum, mean, l2_norm, max_abs and
// has_inf_or_nan on f32/f16/bf16/f64, sizes 0 (mean is NaN), 1, 7, 4096, 4097,
// 33x65 and 1<<20 (several blocks), and inputs holding +inf, -inf and NaN.
// Grad mode (f32, small sizes) for sum, mean and l2_norm, whose gradients are
// written with elementwise kernels: d sum = 1, d mean = 1/n, d |x| = x / |x|.
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "pointwise_case_util.h"
#include "ref/reduce.h"

namespace dtrain::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Op {
  kernels::Reduction kernel;
  ref::Reduction ref;
  const char* name;
};

constexpr Op kOps[] = {
    {kernels::Reduction::sum, ref::Reduction::sum, "sum"},
    {kernels::Reduction::mean, ref::Reduction::mean, "mean"},
    {kernels::Reduction::l2_norm, ref::Reduction::l2_norm, "l2_norm"},
    {kernels::Reduction::max_abs, ref::Reduction::max_abs, "max_abs"},
    {kernels::Reduction::has_inf_or_nan, ref::Reduction::has_inf_or_nan, "has_inf_or_nan"}};

// Backward of the differentiable reductions, from dout (f32 [1]) and out = |x| for l2.
void reduce_backward(kernels::Reduction op, const Tensor& x, const Tensor& out, const Tensor& dout,
                     Tensor& dx) {
  const float w = scalar(dout);
  switch (op) {
    case kernels::Reduction::sum:
      kernels::fill(dx, w);
      break;
    case kernels::Reduction::mean:
      kernels::fill(dx, w / static_cast<float>(x.numel()));
      break;
    case kernels::Reduction::l2_norm:
      kernels::scale(w / scalar(out), x, dx);
      break;
    default:
      DTRAIN_CHECK(false, "reduce op {} has no backward", static_cast<int>(op));
  }
}

KernelCase reduce_case(const Op& op, const char* variant, ArgSpec x) {
  KernelCase c;
  c.name = "reduce/" + std::string(op.name) + "_" + variant + "/" + dname(x.dtype) + "/" +
           (x.shape.numel() == 0 ? "0" : shape_tag(x.shape));
  c.workspace_bytes = kernels::reduce_workspace_bytes(x.shape.numel());
  c.inputs = {std::move(x)};
  c.outputs = {{"out", Shape{1}, DType::f32}};
  c.forward = [op](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace ws) {
    kernels::reduce(op.kernel, in[0], out[0], ws);
  };
  c.reference = [op](const std::vector<Values>& in, std::vector<Values>& out) {
    out[0][0] = ref::reduce(op.ref, in[0].data(), static_cast<int64_t>(in[0].size()));
  };
  c.check_tol = {1e-6, 1e-6};  // double accumulation, one f32 rounding at the end
  const bool smooth = op.kernel == kernels::Reduction::sum ||
                      op.kernel == kernels::Reduction::mean ||
                      op.kernel == kernels::Reduction::l2_norm;
  const bool small = c.inputs[0].shape.numel() > 0 && c.inputs[0].shape.numel() <= 4097;
  if (smooth && small && c.inputs[0].dtype == DType::f32 && c.inputs[0].init == Init::uniform) {
    c.backward = [op](const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                      const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                      kernels::Workspace) {
      reduce_backward(op.kernel, in[0], out[0], dout[0], din[0]);
    };
  }
  return c;
}

ArgSpec specials(DType dt, Values v) {
  ArgSpec a{"x", Shape{static_cast<int64_t>(v.size())}, dt, Init::explicit_values};
  a.values = std::move(v);
  return a;
}

}  // namespace

std::vector<KernelCase> cases_reduce() {
  std::vector<KernelCase> cases;
  for (const Op& op : kOps) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      for (const Shape& s : {Shape{1}, Shape{7}, Shape{4096}, Shape{4097}, Shape{33, 65}}) {
        cases.push_back(reduce_case(op, "random", {"x", s, dt, Init::uniform, -3.0, 2.0}));
      }
      cases.push_back(reduce_case(op, "huge", {"x", Shape{1 << 20}, dt, Init::uniform, 0.0, 1.0}));
      cases.push_back(reduce_case(op, "empty", {"x", Shape{0}, dt}));
      cases.push_back(reduce_case(op, "inf", specials(dt, {1, -kInf, 2, -5})));
      cases.push_back(reduce_case(op, "neg_inf_last", specials(dt, {1, 3, -0.5, -kInf})));
      cases.push_back(reduce_case(op, "nan", specials(dt, {1, kNaN, -7, 2})));
      cases.push_back(reduce_case(op, "finite", specials(dt, {0, -0.0, 65504, -3})));
    }
  }
  // A NaN and an Inf deep in a later block, past a whole finite block.
  Values late(9000, 0.25);
  late[8999] = kNaN;
  late[5000] = kInf;
  for (const Op& op : kOps)
    cases.push_back(reduce_case(op, "late_nan", specials(DType::f32, late)));
  return cases;
}

}  // namespace dtrain::test
