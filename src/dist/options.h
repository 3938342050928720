// Typed options of the distribution module: the process grid (data x tensor x
// pipeline), ZeRO stage and the communicator. Plain data with defaults; src/config
// fills and checks them against the world size. No communication happens here.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/enum_names.h"

namespace dtrain {

enum class PipelineSchedule : uint8_t { gpipe, one_f_one_b };
inline constexpr std::pair<PipelineSchedule, std::string_view> kPipelineScheduleNames[] = {
    {PipelineSchedule::gpipe, "gpipe"}, {PipelineSchedule::one_f_one_b, "1f1b"}};
inline std::string_view to_string(PipelineSchedule v) {
  return enum_name(kPipelineScheduleNames, v);
}
inline bool from_string(std::string_view text, PipelineSchedule& out) {
  return enum_parse(kPipelineScheduleNames, text, out);
}
inline const auto& enum_names(PipelineSchedule) { return kPipelineScheduleNames; }

enum class CommBackend : uint8_t { auto_, mpi, nccl };
inline constexpr std::pair<CommBackend, std::string_view> kCommBackendNames[] = {
    {CommBackend::auto_, "auto"}, {CommBackend::mpi, "mpi"}, {CommBackend::nccl, "nccl"}};
inline std::string_view to_string(CommBackend v) { return enum_name(kCommBackendNames, v); }
inline bool from_string(std::string_view text, CommBackend& out) {
  return enum_parse(kCommBackendNames, text, out);
}
inline const auto& enum_names(CommBackend) { return kCommBackendNames; }

enum class AllreduceAlgo : uint8_t { auto_, native, ring, hierarchical };
inline constexpr std::pair<AllreduceAlgo, std::string_view> kAllreduceAlgoNames[] = {
    {AllreduceAlgo::auto_, "auto"},
    {AllreduceAlgo::native, "native"},
    {AllreduceAlgo::ring, "ring"},
    {AllreduceAlgo::hierarchical, "hierarchical"}};
inline std::string_view to_string(AllreduceAlgo v) { return enum_name(kAllreduceAlgoNames, v); }
inline bool from_string(std::string_view text, AllreduceAlgo& out) {
  return enum_parse(kAllreduceAlgoNames, text, out);
}
inline const auto& enum_names(AllreduceAlgo) { return kAllreduceAlgoNames; }

// world size = pipeline x data x tensor (tensor innermost, so it stays inside a node).
// When the job leaves data out it is world / (tensor x pipeline); when it leaves
// micro_batches out it is global_batch / (micro_batch x data).
// How ranks are numbered over the grid, outermost axis first; tensor is always innermost
// (a tensor group stays inside a node). pp_dp_tp: a pipeline's stages are data x tensor
// ranks apart, its replicas' stage groups neighbours (Megatron's order); dp_pp_tp: a
// replica's stages are neighbours, inside a node when pipeline x tensor fits in one, and
// the gradient all-reduce of each stage goes between nodes.
enum class GridOrder : uint8_t { pp_dp_tp, dp_pp_tp };
inline constexpr std::pair<GridOrder, std::string_view> kGridOrderNames[] = {
    {GridOrder::pp_dp_tp, "pp_dp_tp"}, {GridOrder::dp_pp_tp, "dp_pp_tp"}};
inline std::string_view to_string(GridOrder v) { return enum_name(kGridOrderNames, v); }
inline bool from_string(std::string_view text, GridOrder& out) {
  return enum_parse(kGridOrderNames, text, out);
}
inline const auto& enum_names(GridOrder) { return kGridOrderNames; }

struct ParallelOptions {
  int data = 1;  // `auto` in the job file: the world size / (tensor x pipeline)
  int tensor = 1;
  int pipeline = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  // Model blocks per pipeline stage, by hand (graph/stages.h); unset: balanced by FLOPs.
  std::optional<std::vector<int>> pipeline_blocks;
  int micro_batches = 1;  // micro-batches per optimizer step on each data-parallel rank
  int zero_stage = 0;     // 1: optimizer state, 2: + gradients, 3: + parameters sharded
  GridOrder order = GridOrder::pp_dp_tp;
};

struct CommOptions {
  CommBackend backend = CommBackend::auto_;
  AllreduceAlgo allreduce = AllreduceAlgo::auto_;
  double bucket_mb = 25.0;
  bool overlap = true;                // all-reduce buckets while backward runs
  std::optional<int> ranks_per_node;  // unset: detected from the launcher
  double timeout_s = 300.0;           // a collective unfinished this long: a peer died or hangs
};

}  // namespace dtrain
