// Internal to src/optim: the factories of the three update rules, so optimizer.cpp
// can dispatch without seeing their classes, and a chunk view for the step kernels.
// Not part of the public API.
#pragma once

#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace dtrain::optim::detail {

std::unique_ptr<Optimizer> make_sgd(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                    int64_t total);
std::unique_ptr<Optimizer> make_adamw(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                      int64_t total);
std::unique_ptr<Optimizer> make_lamb(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                     int64_t total);

// Elements [at, at + n) of a flat f32 host buffer as the tensor a fused step kernel takes.
inline Tensor chunk_view(const float* base, int64_t at, int64_t n) {
  return Tensor::wrap(const_cast<float*>(base + at), Shape{n}, DType::f32);
}

}  // namespace dtrain::optim::detail
