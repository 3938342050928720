// Process-grid arithmetic and the per-axis groups (see grid.h).
#include "dist/grid.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::dist {

std::string_view to_string(Axis axis) {
  switch (axis) {
    case Axis::pipeline:
      return "pipeline";
    case Axis::data:
      return "data";
    case Axis::tensor:
      return "tensor";
  }
  return "?";
}

GridDegrees degrees_of(const ParallelOptions& parallel) {
  return {parallel.pipeline, parallel.data, parallel.tensor, parallel.order};
}

void check_grid(int world, const GridDegrees& d) {
  if (d.pipeline < 1 || d.data < 1 || d.tensor < 1) {
    throw Error(
        fmt::format("parallel: pipeline {}, data {}, tensor {}: every degree must be at "
                    "least 1",
                    d.pipeline, d.data, d.tensor));
  }
  if (static_cast<int64_t>(d.pipeline) * d.data * d.tensor != world) {
    throw Error(fmt::format("parallel: pipeline {} x data {} x tensor {} = {}, but the world has "
                            "{} rank(s)",
                            d.pipeline, d.data, d.tensor,
                            static_cast<int64_t>(d.pipeline) * d.data * d.tensor, world),
                "make the degrees multiply to the number of ranks launched (or set "
                "parallel.data: auto)");
  }
}

GridCoord grid_coord(int rank, const GridDegrees& d) {
  DTRAIN_CHECK(rank >= 0 && rank < d.product(), "rank {} of a {}-rank grid", rank, d.product());
  if (d.order == GridOrder::dp_pp_tp)
    return {(rank / d.tensor) % d.pipeline, rank / (d.pipeline * d.tensor), rank % d.tensor};
  return {rank / (d.data * d.tensor), (rank / d.tensor) % d.data, rank % d.tensor};
}

int grid_rank(const GridCoord& c, const GridDegrees& d) {
  if (d.order == GridOrder::dp_pp_tp) return (c.dp * d.pipeline + c.pp) * d.tensor + c.tp;
  return (c.pp * d.data + c.dp) * d.tensor + c.tp;
}

std::vector<RankPlace> describe_grid(int world, const GridDegrees& degrees, int ranks_per_node) {
  check_grid(world, degrees);
  std::vector<RankPlace> out;
  for (int r = 0; r < world; ++r) {
    out.push_back({r, grid_coord(r, degrees), ranks_per_node > 0 ? r / ranks_per_node : 0});
  }
  return out;
}

std::string format_grid(const std::vector<RankPlace>& places) {
  std::string out;
  for (const RankPlace& p : places) {
    out += fmt::format("rank {}: pp {} dp {} tp {} node {}\n", p.rank, p.coord.pp, p.coord.dp,
                       p.coord.tp, p.node);
  }
  return out;
}

namespace {

// Ranks that differ only along `axis` share a colour; the key orders them along it.
std::pair<int, int> split_colour_key(const GridCoord& c, const GridDegrees& d, Axis axis) {
  switch (axis) {
    case Axis::pipeline:
      return {c.dp * d.tensor + c.tp, c.pp};
    case Axis::data:
      return {c.pp * d.tensor + c.tp, c.dp};
    case Axis::tensor:
      return {c.pp * d.data + c.dp, c.tp};
  }
  return {0, 0};
}

int degree(const GridDegrees& d, Axis axis) {
  switch (axis) {
    case Axis::pipeline:
      return d.pipeline;
    case Axis::data:
      return d.data;
    case Axis::tensor:
      return d.tensor;
  }
  return 1;
}

}  // namespace

ProcessGrid::ProcessGrid(Communicator& world, const GridDegrees& degrees)
    : world_(&world), degrees_(degrees) {
  check_grid(world.size(), degrees);
  coord_ = grid_coord(world.rank(), degrees);
  for (Axis axis : {Axis::pipeline, Axis::data, Axis::tensor}) {
    auto& g = groups_[static_cast<int>(axis)];
    if (degree(degrees, axis) == 1) {
      g = make_self_communicator();
    } else {
      const auto [colour, key] = split_colour_key(coord_, degrees, axis);
      g = world.split(colour, key);
    }
  }
}

Communicator& ProcessGrid::group(Axis axis) const { return *groups_[static_cast<int>(axis)]; }

}  // namespace dtrain::dist
