// Process-grid arithmetic (no MPI): tensor innermost, the product checked against
// the world with a message naming `parallel`, every rank's place for validate.
#include <doctest/doctest.h>

#include <string>

#include "core/error.h"
#include "dist/grid.h"

using namespace dtrain::dist;

TEST_CASE("grid coordinates: rank = (pp * data + dp) * tensor + tp") {
  const GridDegrees d{2, 3, 2};
  CHECK(d.product() == 12);
  for (int r = 0; r < 12; ++r) {
    const GridCoord c = grid_coord(r, d);
    CHECK(grid_rank(c, d) == r);
    CHECK(r == (c.pp * 3 + c.dp) * 2 + c.tp);
  }
  CHECK(grid_coord(5, d) == GridCoord{0, 2, 1});
  CHECK(grid_coord(6, d) == GridCoord{1, 0, 0});
}

TEST_CASE("a grid whose degrees do not multiply to the world is refused, naming parallel") {
  CHECK_THROWS_WITH_AS(check_grid(4, {1, 3, 1}),
                       doctest::Contains("parallel: pipeline 1 x data 3 x tensor 1 = 3"),
                       dtrain::Error);
  CHECK_THROWS_WITH_AS(check_grid(4, {1, 0, 4}), doctest::Contains("at least 1"), dtrain::Error);
  CHECK_NOTHROW(check_grid(1, {}));
  CHECK_NOTHROW(check_grid(8, {2, 2, 2}));
}

TEST_CASE("describe_grid gives each rank its coordinates and node") {
  const auto places = describe_grid(8, {1, 4, 2}, 4);
  REQUIRE(places.size() == 8);
  CHECK(places[5].coord == GridCoord{0, 2, 1});
  CHECK(places[5].node == 1);
  CHECK(places[3].node == 0);
  CHECK(describe_grid(3, {1, 3, 1}, 0)[2].node == 0);
  const std::string text = format_grid(describe_grid(2, {1, 2, 1}, 1));
  CHECK(text == "rank 0: pp 0 dp 0 tp 0 node 0\nrank 1: pp 0 dp 1 tp 0 node 1\n");
}

TEST_CASE("a grid over the self communicator: every group is a no-op of size 1") {
  auto self = make_self_communicator();
  ProcessGrid grid(*self, {});
  for (Axis axis : {Axis::pipeline, Axis::data, Axis::tensor}) {
    CHECK(grid.group(axis).size() == 1);
    CHECK(grid.group(axis).rank() == 0);
  }
  CHECK(grid.coord() == GridCoord{});
  CHECK_THROWS_AS(ProcessGrid(*self, {1, 2, 1}), dtrain::Error);
  CHECK(degrees_of(dtrain::ParallelOptions{}).product() == 1);
}

TEST_CASE("grid order dp_pp_tp: a replica's stages are neighbours, tensor still innermost") {
  const GridDegrees d{2, 3, 2, dtrain::GridOrder::dp_pp_tp};
  for (int r = 0; r < d.product(); ++r) CHECK(grid_rank(grid_coord(r, d), d) == r);
  CHECK(grid_coord(0, d) == GridCoord{0, 0, 0});
  CHECK(grid_coord(1, d) == GridCoord{0, 0, 1});
  CHECK(grid_coord(2, d) == GridCoord{1, 0, 0});  // the next stage of replica 0
  CHECK(grid_coord(4, d) == GridCoord{0, 1, 0});  // replica 1 starts after 2 x 2 ranks
  CHECK(grid_coord(11, d) == GridCoord{1, 2, 1});
}
