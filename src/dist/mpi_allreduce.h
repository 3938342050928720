// The all-reduce algorithms over MPI, one class each (MPI-only; they run on the
// communicator's thread): native MPI_Allreduce, our ring over Isend/Irecv in
// pipelined pieces, and hierarchical (ring inside the node, ring across nodes,
// ring all-gather inside the node). Sum or max; no averaging: the caller scales.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"

namespace dtrain::dist {

// `count` elements of `dtype` at `data` (host memory).
struct Span {
  char* data = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
  Span sub(size_t offset, size_t n) const;
};

void native_allreduce(MPI_Comm comm, Span buf, ReduceOp op);

// Reduce-scatter then all-gather around the ring of `comm`'s ranks. Each step's
// segment moves in pieces of at most `piece_bytes`; up to kWindow receive buffers
// are posted at once, so later pieces arrive while the current one is added and a
// link with a long round trip (TCP's rendezvous for each large message) stays busy:
// with two in flight, hierarchical all-reduce between emulated nodes reached only
// 1.15x of the ring instead of the 1.5x its link bytes allow (docs/benchmarks.md).
// `scratch` is reused storage (kWindow pieces).
class RingAllreduce {
 public:
  static constexpr size_t kPieceBytes = size_t{1} << 20;
  static constexpr size_t kWindow = 8;
  RingAllreduce(MPI_Comm comm, std::vector<char>& scratch, size_t piece_bytes = kPieceBytes);

  void run(Span buf, ReduceOp op);
  // Afterwards this rank holds segment ring_owned_segment(rank, size) reduced.
  void reduce_scatter(Span buf, ReduceOp op);
  // Starts from that state; afterwards every rank holds every segment.
  void all_gather(Span buf);

 private:
  void exchange_reduce(Span send, Span recv, ReduceOp op, int tag);
  void exchange_copy(Span send, Span recv, int tag);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<char>& scratch_;
  size_t piece_bytes_ = 0;
};

// Reduce-scatter inside the node, all-reduce of this rank's shard among the ranks
// with the same local index (one per node), all-gather inside the node.
class HierarchicalAllreduce {
 public:
  HierarchicalAllreduce(MPI_Comm intra, MPI_Comm cross, std::vector<char>& scratch);
  void run(Span buf, ReduceOp op);

 private:
  MPI_Comm intra_, cross_;
  std::vector<char>& scratch_;
};

}  // namespace dtrain::dist
