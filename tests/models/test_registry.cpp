// The model registry: every preset has a builder, unknown archs fail naming
// the arch and listing the built ones, and the summary reads the graph.
#include <doctest/doctest.h>

#include "models/registry.h"

using namespace dtrain;
using namespace dtrain::models;

TEST_CASE("every registered model is a known architecture, and every preset has a builder") {
  CHECK(built_models().size() == std::size(kArchPresets));
  for (const ModelEntry& e : built_models()) {
    CAPTURE(e.arch);
    REQUIRE(find_arch(e.arch) != nullptr);
    CHECK(find_model(e.arch) == &e);
  }
  for (const ArchPreset& a : kArchPresets) CHECK(find_model(a.name) != nullptr);
}

TEST_CASE("unknown archs are user errors listing the built ones") {
  ModelOptions o;
  o.arch = "resnet51";
  try {
    build_model(o, 1);
  } catch (const Error& e) {
    CHECK(e.hint().find("resnet18, resnet34, resnet50, resnet101, resnet152, bert-tiny") !=
          std::string::npos);
  }
  CHECK_THROWS_WITH_AS(build_model(o, 1), doctest::Contains("\"resnet51\": unknown architecture"),
                       Error);
  o.arch = "resnet18";
  CHECK_THROWS_WITH_AS(build_model(o, 0), doctest::Contains("batch must be at least 1"), Error);
}

TEST_CASE("summarize counts parameters and per-sample FLOPs of the batch-1 graph") {
  ModelOptions o = preset_options(*find_arch("resnet18"));
  o.stem = ResNetStem::small;
  o.width = 0.25;
  o.image_size = 28;
  o.in_channels = 1;
  o.num_classes = 10;
  const ModelSummary s = summarize(o);
  const ModelGraph two = build_model(o, 2);
  CHECK(s.params == two.graph.num_params());
  CHECK(s.forward_flops_per_sample == doctest::Approx(two.graph.forward_flops() / 2));
}
