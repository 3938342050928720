// Kernel-table cases for kernels/layout.h permute: the head split/merge
// permutations attention uses, a full reversal, identity, and rank 1..6, on
// f32, bf16 and i32. Grad mode: the backward of a permute is the inverse permute.
#include "kernels/layout.h"

#include <vector>

#include "harness.h"
#include "ref/layout.h"

namespace dtrain::test {

namespace {

Shape permuted(const Shape& s, const std::vector<int>& perm) {
  Shape y;
  for (int p : perm) y.push_back(s[p]);
  return y;
}

KernelCase make(const Shape& s, std::vector<int> perm, DType dt) {
  std::string tag;
  for (int p : perm) tag += std::to_string(p);
  KernelCase c;
  c.name = "layout/permute" + tag + "/" + std::string(dtype_name(dt)) + "/" + shape_tag(s);
  const bool is_int = dt == DType::i32;
  c.inputs = {{"x",
               s,
               dt,
               is_int ? Init::integers : Init::uniform,
               is_int ? -1000.0 : -1.0,
               is_int ? 1000.0 : 1.0,
               {},
               !is_int}};
  c.outputs = {{"y", permuted(s, perm), dt}};
  c.check_tol = {0.0, 0.0};  // a permute moves bits, it computes nothing
  c.forward = [perm](const std::vector<Tensor>& in, std::vector<Tensor>& out, kernels::Workspace) {
    kernels::permute(in[0], perm, out[0]);
  };
  c.reference = [s, perm](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::permute(s, perm, in[0].data(), out[0].data());
  };
  if (dt == DType::f32) {
    c.backward = [perm](const std::vector<Tensor>&, const std::vector<Tensor>&,
                        const std::vector<Tensor>& dout, std::vector<Tensor>& din,
                        kernels::Workspace) {
      std::vector<int> inverse(perm.size());
      for (size_t i = 0; i < perm.size(); ++i)
        inverse[static_cast<size_t>(perm[i])] = static_cast<int>(i);
      kernels::permute(dout[0], inverse, din[0]);
    };
  }
  return c;
}

}  // namespace

std::vector<KernelCase> cases_layout() {
  std::vector<KernelCase> cases;
  for (DType dt : {DType::f32, DType::bf16, DType::i32}) {
    cases.push_back(make({2, 5, 3, 2, 4}, {2, 0, 3, 1, 4}, dt));  // qkv split
    cases.push_back(make({3, 2, 2, 5, 4}, {1, 3, 0, 2, 4}, dt));  // qkv unsplit
    cases.push_back(make({2, 3, 7, 5}, {0, 2, 1, 3}, dt));        // head merge
  }
  cases.push_back(make({17}, {0}, DType::f32));
  cases.push_back(make({3, 1, 4}, {2, 1, 0}, DType::f32));
  cases.push_back(make({2, 3, 1, 2, 3, 2}, {5, 4, 3, 2, 1, 0}, DType::f32));
  cases.push_back(make({33, 65}, {1, 0}, DType::f32));
  return cases;
}

}  // namespace dtrain::test
