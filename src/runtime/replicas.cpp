// Buffer averaging and the replica check.
#include "runtime/replicas.h"

#include "core/checksum.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::runtime {

BufferAverage::BufferAverage(graph::FlatStore& buffers, int micro_batches, dist::Communicator& comm)
    : total_(micro_batches * comm.size()), comm_(comm) {
  for (const graph::FlatEntry& e : buffers.entries()) {
    DTRAIN_CHECK(e.spec.dtype == DType::f32, "buffer {} is {}: only f32 buffers are averaged",
                 e.name, dtype_name(e.spec.dtype));
  }
  live_ = buffers.flat(DType::f32);
  if (!live_.defined()) return;
  Allocator* alloc = &kernels::device_allocator(buffers.device());
  start_ = Tensor::empty(live_.shape(), DType::f32, alloc);
  if (total_ > 1) sum_ = Tensor::empty(live_.shape(), DType::f32, alloc);
}

void BufferAverage::begin_micro(int m) {
  if (!start_.defined()) return;
  if (m == 0) {
    kernels::copy(live_, start_);
  } else {
    kernels::copy(start_, live_);
  }
}

void BufferAverage::discard() {
  if (start_.defined()) kernels::copy(start_, live_);
}

void BufferAverage::end_micro(int m) {
  if (!sum_.defined()) return;
  if (m == 0) {
    kernels::copy(live_, sum_);
  } else {
    kernels::axpy(1.0f, live_, sum_);
  }
}

void BufferAverage::finish() {
  if (!sum_.defined()) return;
  if (comm_.size() > 1) {
    DTRAIN_CHECK(sum_.device() == comm_.device(), "{} communicator, buffers on {}",
                 comm_.device().str(), sum_.device().str());
    comm_.all_reduce(sum_);
  }
  kernels::scale(1.0f / static_cast<float>(total_), sum_, live_);
}

std::string replica_mismatch(dist::Communicator& comm, const std::vector<Tensor>& tensors,
                             const char* what) {
  if (comm.size() == 1) return "";
  uint32_t crc = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    const Tensor h = kernels::to_host(t);
    crc = crc32c(h.raw(), h.nbytes(), crc);
  }
  Tensor mine = Tensor::empty(Shape{1}, DType::i64);
  mine.data<int64_t>()[0] = crc;
  Tensor all = Tensor::empty(Shape{comm.size()}, DType::i64);
  comm.all_gather(mine, all);
  const int64_t* c = all.data<int64_t>();
  for (int r = 1; r < comm.size(); ++r) {
    if (c[r] == c[0]) continue;
    return fmt::format(
        "replicas diverged: the {} of rank {} of a group of {} (CRC-32C {:08x}) differ from its "
        "rank 0's ({:08x})",
        what, r, comm.size(), static_cast<uint32_t>(c[r]), static_cast<uint32_t>(c[0]));
  }
  return "";
}

}  // namespace dtrain::runtime
