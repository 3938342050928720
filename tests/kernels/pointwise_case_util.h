// Small helpers shared by the pointwise case files (cases_layernorm.cpp,
// cases_activation.cpp, ...): dtype names, per-dtype tolerances and the list
// of float dtypes. Nothing here runs a kernel.
#pragma once

#include <string>

#include "harness.h"

namespace dtrain::test {

inline std::string dname(DType t) { return std::string(dtype_name(t)); }

inline constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

// Tolerance for a result computed in f32 and stored once in `t`: f32 gets
// `f32` (caller's choice), halves a few units in the last place of their format.
inline Tolerance tol_for(DType t, Tolerance f32 = {1e-6, 1e-5}) {
  switch (t) {
    case DType::f16:
      return {2e-3, 2e-3};
    case DType::bf16:
      return {1.6e-2, 1.6e-2};
    default:
      return f32;
  }
}

}  // namespace dtrain::test
