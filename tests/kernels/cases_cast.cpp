// Kernel-table cases for kernels::cast: every source in {f32, f16, bf16, f64,
// i32, i64, u8} to every float type {f32, f16, bf16, f64}, on random values and
// on special values (ties, subnormals, overflow to Inf, NaN, signed zero,
// double-rounding traps). The reference rounds with ref::round_to_format, its
// own fp64 arithmetic, never core/dtype.h. Casts are exact: tolerance 0.
#include <cmath>
#include <limits>

#include "kernels/elementwise.h"
#include "pointwise_case_util.h"
#include "ref/elementwise.h"

namespace dtrain::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

double p2(int e) { return std::ldexp(1.0, e); }

// Special values for float sources (each source dtype first rounds them to itself).
Values float_specials() {
  return {
      0.0,
      -0.0,
      1.0,
      -2.5,
      kInf,
      -kInf,
      kNaN,
      1 + p2(-11),
      1 + 3 * p2(-11),
      -(1 + 3 * p2(-11)),
      2049,
      2051,  // f16 ties
      1 + p2(-8),
      1 + 3 * p2(-8),
      257,
      259,  // bf16 ties
      1 + p2(-24),
      1 + 3 * p2(-24),  // f32 ties (f64 source)
      1 + p2(-11) + p2(-40),
      1 + p2(-8) + p2(-40),
      1 + p2(-24) + p2(-60),  // double rounding
      p2(-24),
      p2(-25),
      3 * p2(-25),
      p2(-20) + p2(-25),
      1e-8,
      -p2(-25),  // f16 subnormals
      p2(-130),
      p2(-133),
      p2(-134),
      3 * p2(-134),
      p2(-149),
      1.5 * p2(-149),
      p2(-150),
      65504,
      65519,
      65520,
      -65520,
      1e6,
      3.38e38,
      3.4e38,
      3.4028234663852886e38,
      1e39,
      1e-50,
  };
}

Values int_specials(DType src) {
  if (src == DType::u8) return {0, 1, 127, 128, 255, 3, 200, 254};
  Values v = {0,        1,          -1,           65504, 65519, 65520, -65520, 2049, 2051, 257, 259,
              16842753,  // 2^24 + 2^16 + 1: via f32 it would round twice (bf16)
              16777217, 2147483647, -2147483648.0};
  if (src == DType::i64) {
    for (double x : {p2(54) + p2(46) + 4, p2(62), -p2(63), p2(40) + p2(32) + 1}) v.push_back(x);
  }
  return v;
}

KernelCase cast_case(DType src, DType dst, const char* variant, ArgSpec input) {
  KernelCase c;
  c.name = "cast/" + std::string(variant) + "_" + dname(src) + "/" + dname(dst) + "/" +
           shape_tag(input.shape);
  c.inputs = {std::move(input)};
  c.outputs = {{"y", c.inputs[0].shape, dst}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::cast(in[0], out[0]);
  };
  c.reference = [dst](const std::vector<Values>& in, std::vector<Values>& out) {
    for (size_t i = 0; i < in[0].size(); ++i) out[0][i] = ref::round_to_dtype(in[0][i], dst);
  };
  c.check_tol = {0.0, 0.0};
  // f32 -> f64 is the identity on values (finite differences of f32 -> f32 would see
  // the rounding staircase): its backward casts the gradient back.
  if (src == DType::f32 && dst == DType::f64 && c.inputs[0].init != Init::explicit_values) {
    c.backward = [](const std::vector<Tensor>&, const std::vector<Tensor>&,
                    const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                    kernels::Workspace) { kernels::cast(dout[0], din[0]); };
  }
  return c;
}

ArgSpec random_input(DType src) {
  const bool integer = src == DType::i32 || src == DType::i64 || src == DType::u8;
  ArgSpec a{"x", Shape{5000}, src, integer ? Init::integers : Init::uniform, -70000.0, 70000.0};
  if (src == DType::u8) a.lo = 0, a.hi = 256;
  if (src == DType::f16) a.lo = -65504, a.hi = 65504;
  return a;
}

ArgSpec special_input(DType src) {
  const bool integer = src == DType::i32 || src == DType::i64 || src == DType::u8;
  Values v = integer ? int_specials(src) : float_specials();
  ArgSpec a{"x", Shape{static_cast<int64_t>(v.size())}, src, Init::explicit_values};
  a.values = std::move(v);
  return a;
}

}  // namespace

std::vector<KernelCase> cases_cast() {
  std::vector<KernelCase> cases;
  for (DType src :
       {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8}) {
    for (DType dst : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      cases.push_back(cast_case(src, dst, "random", random_input(src)));
      cases.push_back(cast_case(src, dst, "special", special_input(src)));
      ArgSpec small{"x", Shape{7}, src, Init::uniform, -3.0, 3.0};
      if (src == DType::u8) small.init = Init::integers, small.lo = 0, small.hi = 256;
      cases.push_back(cast_case(src, dst, "small", small));
    }
  }
  return cases;
}

}  // namespace dtrain::test
