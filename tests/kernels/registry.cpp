// The explicit list of kernel-table families (no static self-registration).
#include "harness.h"

namespace dtrain::test {

std::vector<KernelCase> all_cases() {
  std::vector<KernelCase> all;
  for (auto* family :
       {cases_gemm, cases_conv, cases_batchnorm, cases_pooling, cases_attention, cases_layernorm,
        cases_activation, cases_softmax, cases_embedding, cases_dropout, cases_elementwise,
        cases_cast, cases_reduce, cases_layout, cases_optimizer, cases_compress}) {
    for (KernelCase& c : family()) all.push_back(std::move(c));
  }
  return all;
}

}  // namespace dtrain::test
