// The explicit table of model builders: architecture name -> a function that
// builds the single-device training graph. The list lives in registry.cpp
// (kModels), deliberately not static self-registration, which silently loses
// entries under static linking. Builders know nothing of ranks; of precision they
// know only the graph's DTypePolicy (images enter f32 and are cast once).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "models/model.h"
#include "models/options.h"

namespace dtrain::models {

using BuildFn = ModelGraph (*)(const ModelOptions& options, int64_t batch,
                               const graph::DTypePolicy& policy);

struct ModelEntry {
  std::string_view arch;  // as in kArchPresets
  BuildFn build;
};

std::span<const ModelEntry> built_models();
const ModelEntry* find_model(std::string_view arch);  // nullptr when there is no builder yet

// The shapes of models/model.h (labels [batch] or [batch, T]), loss = softmax cross-entropy. Throws
// Error naming the arch (and listing the built ones) when there is no builder.
// `policy`: the dtypes of parameters and activations (precision.dtype; default all f32).
ModelGraph build_model(const ModelOptions& options, int64_t batch,
                       const graph::DTypePolicy& policy = {});

struct ModelSummary {
  int64_t params = 0;                   // trainable parameters (BN running stats excluded)
  double forward_flops_per_sample = 0;  // every op's forward FLOPs (convs/fc: 2 per MAC)
};

// Builds the graph at batch 1 and reads its totals; allocates no parameters.
ModelSummary summarize(const ModelOptions& options);

}  // namespace dtrain::models
