// All-reduce algorithm support that needs no MPI: the ring's segment and step
// arithmetic (pure, unit-tested), and `auto`: time each algorithm per bucket-size
// class, agree across ranks on the fastest, print the table. The algorithms
// themselves run on the communicator's thread (mpi_allreduce.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace dtrain::dist {

// [offset, offset + count) elements of a buffer.
struct Segment {
  size_t offset = 0;
  size_t count = 0;
};

// Segment `index` of `n` elements cut into `parts`: n / parts each, the first
// n % parts segments one element longer.
Segment ring_segment(size_t n, int parts, int index);

// Which segments a rank sends to its right neighbour and receives from its left
// one at `step` (0 .. size - 2) of each ring phase.
struct RingStep {
  int send = 0;
  int recv = 0;
};
// Reduce-scatter: segment s is summed along ranks s, s+1, ..., s-1 (mod size), one
// fixed order per world size, so every rank ends with identical bits.
RingStep ring_reduce_scatter_step(int rank, int size, int step);
RingStep ring_all_gather_step(int rank, int size, int step);
// The segment a rank holds fully reduced after the reduce-scatter phase.
int ring_owned_segment(int rank, int size);
// How many pieces of at most `piece` elements cover `count` elements.
size_t ring_piece_count(size_t count, size_t piece);

// `auto`: one row per bucket-size class (the power of two at or above the size).
struct AutoEntry {
  size_t bytes = 0;  // the largest bucket of the class (what was timed)
  AllreduceAlgo algo = AllreduceAlgo::native;
  std::vector<std::pair<AllreduceAlgo, double>> seconds;  // max over ranks, per candidate
};
struct AutoChoice {
  std::vector<AutoEntry> entries;  // ascending bytes
  // The choice for a bucket of `bytes`: its class's row, else the nearest one above or
  // the largest; native when nothing was tuned.
  AllreduceAlgo algo_for(size_t bytes) const;
};

// Whether `comm` can run the hierarchical all-reduce: more than one node, with more than
// one rank each (as many on every node).
bool hierarchical_possible(Communicator& comm);
// Times native, ring and (where hierarchical_possible, unless `hierarchical` is false)
// hierarchical all-reduce of f32 buckets, `reps` runs after a warm-up, the median
// per rank then the max over ranks. Collective: every rank gets the same table.
// `scratch` (f32 on the communicator's device, when given and large enough: the
// gradient buffer the buckets are ranges of) is timed on and left zero, so that tuning
// takes no memory beside what training holds; otherwise a buffer is allocated.
AutoChoice tune_allreduce(Communicator& comm, const std::vector<size_t>& bucket_bytes, int reps = 3,
                          const Tensor& scratch = {}, bool hierarchical = true);
// `root`'s choice on every rank of `comm` (sizes and algorithms; the times are root's
// alone): a grid's data groups all take the one its first group timed. Collective.
AutoChoice broadcast_choice(Communicator& comm, const AutoChoice& choice, int root);
// A few readable lines under `title`: one per size class, the choice and every
// candidate's time (none for a choice read back from a checkpoint).
std::string format_auto_choice(
    const AutoChoice& choice,
    const std::string& title = "all-reduce auto (max over ranks of the median time):");

}  // namespace dtrain::dist
