// The model registry: the one list of built architectures, lookup, and the
// summary `dtrain validate` prints. Adding a model = one row in kModels.
#include "models/registry.h"

#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "models/resnet.h"
#include "models/vit.h"

namespace dtrain::models {
namespace {

template <const ResNetDepth& depth>
ModelGraph resnet(const ModelOptions& options, int64_t batch, const graph::DTypePolicy& policy) {
  return build_resnet(depth, options, batch, policy);
}

ModelGraph bert(const ModelOptions& options, int64_t batch, const graph::DTypePolicy& policy) {
  return build_bert(options, batch, policy);
}

constexpr ModelEntry kModels[] = {
    {"resnet18", resnet<kResNet18>},
    {"resnet34", resnet<kResNet34>},
    {"resnet50", resnet<kResNet50>},
    {"resnet101", resnet<kResNet101>},
    {"resnet152", resnet<kResNet152>},
    {"bert-tiny", bert},
    {"bert-mini", bert},
    {"bert-small", bert},
    {"bert-base", bert},
    {"bert-large", bert},
    {"vit-tiny", build_vit},
    {"vit-small", build_vit},
    {"vit-base", build_vit},
    {"vit-large", build_vit},
    {"gpt2-tiny", build_gpt2},
    {"gpt2", build_gpt2},
    {"gpt2-medium", build_gpt2},
    {"gpt2-large", build_gpt2},
    {"gpt2-xl", build_gpt2},
};

std::string built_names() {
  std::vector<std::string_view> names;
  for (const ModelEntry& e : kModels) names.push_back(e.arch);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

std::span<const ModelEntry> built_models() { return kModels; }

const ModelEntry* find_model(std::string_view arch) {
  for (const ModelEntry& e : kModels)
    if (e.arch == arch) return &e;
  return nullptr;
}

ModelGraph build_model(const ModelOptions& options, int64_t batch,
                       const graph::DTypePolicy& policy) {
  const ModelEntry* entry = find_model(options.arch);
  if (entry == nullptr) {
    const bool known = find_arch(options.arch) != nullptr;
    throw Error(
        fmt::format("model \"{}\": {}", options.arch,
                    known ? "no graph builder for this architecture yet" : "unknown architecture"),
        fmt::format("architectures with a graph builder: {}", built_names()));
  }
  if (batch < 1) {
    throw Error(fmt::format("model \"{}\": batch must be at least 1, got {}", options.arch, batch));
  }
  ModelGraph m = entry->build(options, batch, policy);
  if (m.targets < 0) m.targets = m.labels;
  return m;
}

ModelSummary summarize(const ModelOptions& options) {
  const ModelGraph m = build_model(options, 1);
  return {m.graph.num_params(), m.graph.forward_flops()};
}

}  // namespace dtrain::models
