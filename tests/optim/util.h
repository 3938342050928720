// Test helpers shared by the optim tests: a segment layout with padding, a no_decay
// segment and a segment longer than one chunk; tensors over std::vector storage.
#pragma once

#include <cstring>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace dtrain::optim::test {

// 9400 elements: w [0, 300), padding, b [320, 337) no_decay, padding, big [352, 9352)
// (two chunks of kChunkElems), then padding to the end.
inline constexpr int64_t kTotal = 9400;
inline std::vector<ParamSegment> layout() {
  return {{"w", 0, 300, DecayMode::decay},
          {"b", 320, 17, DecayMode::no_decay},
          {"big", 352, 9000, DecayMode::decay}};
}

inline Tensor as_tensor(std::vector<float>& v) {
  return Tensor::wrap(v.data(), Shape{static_cast<int64_t>(v.size())}, DType::f32);
}

inline bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

inline OptimizerOptions options_for(OptimizerName name) {
  OptimizerOptions o;
  o.name = name;
  o.weight_decay = 0.1;
  o.momentum = 0.9;
  o.betas = {0.9, 0.99};
  return o;
}

}  // namespace dtrain::optim::test
