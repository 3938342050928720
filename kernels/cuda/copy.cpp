// Explicit copies and synchronize on the backend's streams. A copy runs on the
// stream of the CUDA device involved (the destination's for device to device),
// so it is ordered after the kernels that produced src there. Across two
// devices the source's stream is drained first, then cudaMemcpyPeerAsync.
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

bool pinned(const void* host) {
  cudaPointerAttributes attr{};
  DTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attr, host));
  return attr.type == cudaMemoryTypeHost;
}

void require_pinned(const Tensor& host_side) {
  if (!host_side.device().is_cpu() || pinned(host_side.raw())) return;
  throw Error(fmt::format("a stream-ordered copy needs pinned host memory, but {} is pageable",
                          host_side.str()),
              "allocate the host tensor from kernels::pinned_host_allocator(), or copy with "
              "CopySync::blocking");
}

}  // namespace

void copy(const Tensor& src, Tensor& dst, CopySync sync) {
  const Device sd = src.device(), dd = dst.device();
  Context& ctx = Context::get(dd.is_cuda() ? dd.index : sd.index);
  if (sync == CopySync::stream_ordered) {
    require_pinned(src);
    require_pinned(dst);
  }
  if (sd.is_cuda() && dd.is_cuda() && sd.index != dd.index) {
    Context::get(sd.index).synchronize();
    ctx.activate();
    DTRAIN_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst.raw(), dd.index, src.raw(), sd.index, src.nbytes(), ctx.stream()));
  } else {
    // cudaMemcpyDefault: unified addressing tells the direction from the pointers.
    DTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault, ctx.stream()));
  }
  if (sync == CopySync::blocking) ctx.synchronize();
}

void synchronize(int device) { Context::get(device).synchronize(); }

// The compute stream waits on the event as recorded now, so reusing one event for
// every upload is safe: each wait refers to its own record.
void upload(const Tensor& pinned_src, Tensor& dst) {
  require_pinned(pinned_src);
  Context& ctx = Context::get(dst.device().index);
  DTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), pinned_src.raw(), pinned_src.nbytes(),
                                    cudaMemcpyHostToDevice, ctx.upload_stream()));
  DTRAIN_CUDA_CHECK(cudaEventRecord(ctx.upload_done(), ctx.upload_stream()));
  DTRAIN_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), ctx.upload_done(), 0));
}

}  // namespace dtrain::kernels::cuda_ops
