// Native, ring and hierarchical all-reduce over MPI (see mpi_allreduce.h). The
// ring reduces each segment once along a fixed chain of ranks and then copies it
// around, so every rank ends with the same bits; hierarchical composes rings.
#include "dist/mpi_allreduce.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "dist/allreduce.h"
#include "dist/mpi_common.h"

namespace dtrain::dist {

Span Span::sub(size_t offset, size_t n) const {
  return {data + offset * dtype_size(dtype), n, dtype};
}

namespace {

template <typename T>
void reduce_into(char* dst, const char* src, size_t n, ReduceOp op) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  if (op == ReduceOp::sum) {
    for (size_t i = 0; i < n; ++i) d[i] = d[i] + s[i];
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = std::max(d[i], s[i]);
  }
}

// dst[i] = dst[i] (op) src[i] for `n` elements of `dtype`.
void reduce_into(DType dtype, char* dst, const char* src, size_t n, ReduceOp op) {
  switch (dtype) {
    case DType::f32:
      return reduce_into<float>(dst, src, n, op);
    case DType::f64:
      return reduce_into<double>(dst, src, n, op);
    case DType::i32:
      return reduce_into<int32_t>(dst, src, n, op);
    case DType::i64:
      return reduce_into<int64_t>(dst, src, n, op);
    default:
      DTRAIN_CHECK(false, "reduce of {}", dtype_name(dtype));
  }
}

int piece_len(size_t count, size_t piece, size_t k) {
  return static_cast<int>(std::min(piece, count - k * piece));
}

}  // namespace

void native_allreduce(MPI_Comm comm, Span buf, ReduceOp op) {
  constexpr size_t kMaxCount = INT_MAX / 2;  // MPI counts are int
  for (size_t done = 0; done < buf.count; done += kMaxCount) {
    const Span part = buf.sub(done, std::min(kMaxCount, buf.count - done));
    DTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, part.data, static_cast<int>(part.count),
                                   mpi_type(buf.dtype), mpi_op(op), comm));
  }
}

RingAllreduce::RingAllreduce(MPI_Comm comm, std::vector<char>& scratch, size_t piece_bytes)
    : comm_(comm), scratch_(scratch), piece_bytes_(piece_bytes) {
  DTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  DTRAIN_MPI_CHECK(MPI_Comm_size(comm, &size_));
}

void RingAllreduce::run(Span buf, ReduceOp op) {
  reduce_scatter(buf, op);
  all_gather(buf);
}

void RingAllreduce::reduce_scatter(Span buf, ReduceOp op) {
  for (int step = 0; step + 1 < size_; ++step) {
    const RingStep s = ring_reduce_scatter_step(rank_, size_, step);
    const Segment out = ring_segment(buf.count, size_, s.send);
    const Segment in = ring_segment(buf.count, size_, s.recv);
    exchange_reduce(buf.sub(out.offset, out.count), buf.sub(in.offset, in.count), op, step);
  }
}

void RingAllreduce::all_gather(Span buf) {
  for (int step = 0; step + 1 < size_; ++step) {
    const RingStep s = ring_all_gather_step(rank_, size_, step);
    const Segment out = ring_segment(buf.count, size_, s.send);
    const Segment in = ring_segment(buf.count, size_, s.recv);
    exchange_copy(buf.sub(out.offset, out.count), buf.sub(in.offset, in.count), size_ + step);
  }
}

// Sends `send` to the right in pieces while receiving the left neighbour's pieces
// of `recv` into a window of kWindow scratch buffers and reducing each into place,
// in piece order (the sums do not depend on the window: each element is added once).
void RingAllreduce::exchange_reduce(Span send, Span recv, ReduceOp op, int tag) {
  const size_t elem = dtype_size(send.dtype);
  const size_t piece = std::max<size_t>(1, piece_bytes_ / elem);
  const MPI_Datatype type = mpi_type(send.dtype);
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const size_t ns = ring_piece_count(send.count, piece), nr = ring_piece_count(recv.count, piece);
  const size_t window = std::max<size_t>(1, std::min(kWindow, nr));
  if (scratch_.size() < window * piece * elem) scratch_.resize(window * piece * elem);

  std::vector<MPI_Request> sends(ns, MPI_REQUEST_NULL);
  for (size_t k = 0; k < ns; ++k) {
    DTRAIN_MPI_CHECK(MPI_Isend(send.data + k * piece * elem, piece_len(send.count, piece, k), type,
                               right, tag, comm_, &sends[k]));
  }
  std::vector<MPI_Request> recvs(window, MPI_REQUEST_NULL);
  auto slot = [&](size_t k) { return scratch_.data() + (k % window) * piece * elem; };
  auto post = [&](size_t k) {
    DTRAIN_MPI_CHECK(MPI_Irecv(slot(k), piece_len(recv.count, piece, k), type, left, tag, comm_,
                               &recvs[k % window]));
  };
  for (size_t k = 0; k < std::min(window, nr); ++k) post(k);
  for (size_t k = 0; k < nr; ++k) {
    DTRAIN_MPI_CHECK(MPI_Wait(&recvs[k % window], MPI_STATUS_IGNORE));
    reduce_into(recv.dtype, recv.data + k * piece * elem, slot(k),
                static_cast<size_t>(piece_len(recv.count, piece, k)), op);
    if (k + window < nr) post(k + window);
  }
  DTRAIN_MPI_CHECK(MPI_Waitall(static_cast<int>(ns), sends.data(), MPI_STATUSES_IGNORE));
}

// Sends `send` to the right and receives `recv` from the left, straight into place.
void RingAllreduce::exchange_copy(Span send, Span recv, int tag) {
  const size_t elem = dtype_size(send.dtype);
  const size_t piece = std::max<size_t>(1, piece_bytes_ / elem);
  const MPI_Datatype type = mpi_type(send.dtype);
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const size_t ns = ring_piece_count(send.count, piece), nr = ring_piece_count(recv.count, piece);
  std::vector<MPI_Request> reqs(ns + nr, MPI_REQUEST_NULL);
  for (size_t k = 0; k < nr; ++k) {
    DTRAIN_MPI_CHECK(MPI_Irecv(recv.data + k * piece * elem, piece_len(recv.count, piece, k), type,
                               left, tag, comm_, &reqs[k]));
  }
  for (size_t k = 0; k < ns; ++k) {
    DTRAIN_MPI_CHECK(MPI_Isend(send.data + k * piece * elem, piece_len(send.count, piece, k), type,
                               right, tag, comm_, &reqs[nr + k]));
  }
  DTRAIN_MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
}

HierarchicalAllreduce::HierarchicalAllreduce(MPI_Comm intra, MPI_Comm cross,
                                             std::vector<char>& scratch)
    : intra_(intra), cross_(cross), scratch_(scratch) {}

void HierarchicalAllreduce::run(Span buf, ReduceOp op) {
  int local = 0, local_size = 1;
  DTRAIN_MPI_CHECK(MPI_Comm_rank(intra_, &local));
  DTRAIN_MPI_CHECK(MPI_Comm_size(intra_, &local_size));
  RingAllreduce node(intra_, scratch_);
  node.reduce_scatter(buf, op);
  const Segment shard = ring_segment(buf.count, local_size, ring_owned_segment(local, local_size));
  RingAllreduce(cross_, scratch_).run(buf.sub(shard.offset, shard.count), op);
  node.all_gather(buf);
}

}  // namespace dtrain::dist
