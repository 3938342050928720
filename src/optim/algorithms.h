// Internal to src/optim: the factories of the three update rules, so optimizer.cpp
// can dispatch without seeing their classes. Not part of the public API.
#pragma once

#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace dtrain::optim::detail {

std::unique_ptr<Optimizer> make_sgd(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                    int64_t total, Device device);
std::unique_ptr<Optimizer> make_adamw(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                      int64_t total, Device device);
std::unique_ptr<Optimizer> make_lamb(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                     int64_t total, Device device);

}  // namespace dtrain::optim::detail
