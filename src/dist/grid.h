// The process grid: the world factored into pipeline x data x tensor groups,
// tensor innermost (rank = (pp * data + dp) * tensor + tp, or with order dp_pp_tp
// (dp * pipeline + pp) * tensor + tp), so a tensor group stays inside a node. A value passed
// around, never a global. The placement arithmetic is pure (for `dtrain validate --world N`, no MPI
// needed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/options.h"

namespace dtrain::dist {

enum class Axis : uint8_t { pipeline, data, tensor };
std::string_view to_string(Axis axis);

struct GridDegrees {
  int pipeline = 1, data = 1, tensor = 1;
  GridOrder order = GridOrder::pp_dp_tp;  // how ranks are numbered (dist/options.h)
  int product() const { return pipeline * data * tensor; }
};
GridDegrees degrees_of(const ParallelOptions& parallel);

struct GridCoord {
  int pp = 0, dp = 0, tp = 0;
  bool operator==(const GridCoord&) const = default;
};

// Throws dtrain::Error naming `parallel` unless every degree is >= 1 and their
// product is the world size.
void check_grid(int world, const GridDegrees& degrees);
GridCoord grid_coord(int rank, const GridDegrees& degrees);
int grid_rank(const GridCoord& coord, const GridDegrees& degrees);

// Where each rank sits: its coordinates and its node (consecutive ranks_per_node
// ranks per node; 0 or less: one node).
struct RankPlace {
  int rank = 0;
  GridCoord coord;
  int node = 0;
};
std::vector<RankPlace> describe_grid(int world, const GridDegrees& degrees, int ranks_per_node);
std::string format_grid(const std::vector<RankPlace>& places);  // one line per rank

class ProcessGrid {
 public:
  // Collective over `world` (one split per axis of degree > 1); `world` must outlive the grid.
  ProcessGrid(Communicator& world, const GridDegrees& degrees);

  Communicator& world() const { return *world_; }
  Communicator& group(Axis axis) const;  // degree 1: a group of one (every collective a no-op)
  const GridDegrees& degrees() const { return degrees_; }
  const GridCoord& coord() const { return coord_; }

 private:
  Communicator* world_;
  GridDegrees degrees_;
  GridCoord coord_;
  std::shared_ptr<Communicator> groups_[3];  // indexed by Axis
};

}  // namespace dtrain::dist
