// kernels/cuda_ops.h for gradient compression: unwraps the (already checked)
// Tensors into the launchers of kernels/cuda/compress.cuh on the device's stream.
#include "kernels/cuda/compress.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {
const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }
}  // namespace

size_t topk_workspace_bytes(int64_t n) { return topk_temp_bytes(n); }

void topk_select(const Tensor& x, Tensor& indices, Tensor& values, Workspace ws) {
  launch_topk(f32(x), x.numel(), indices.numel(), static_cast<int32_t*>(indices.raw()), f32(values),
              ws.data, ws.bytes, stream_of(x));
}

void scatter_add(const Tensor& indices, const Tensor& values, int64_t segment, Tensor& out) {
  launch_scatter_add(i32(indices), f32(values), indices.numel(), segment, f32(out), out.numel(),
                     stream_of(out));
}

void clear_at(const Tensor& indices, Tensor& x) {
  launch_clear_at(i32(indices), indices.numel(), f32(x), x.numel(), stream_of(x));
}

void sign_pack(const Tensor& x, int64_t chunk, Tensor& words, Tensor& scales) {
  launch_sign_pack(f32(x), x.numel(), chunk, static_cast<uint32_t*>(words.raw()), f32(scales),
                   stream_of(x));
}

void sign_unpack(const Tensor& words, const Tensor& scales, int64_t chunk, Tensor& out, bool add) {
  launch_sign_unpack(static_cast<const uint32_t*>(words.raw()), f32(scales), out.numel(), chunk,
                     f32(out), add, stream_of(out));
}

void orthonormalize_columns(Tensor& a) {
  launch_orthonormalize_columns(f32(a), a.shape()[0], a.shape()[1], stream_of(a));
}

}  // namespace dtrain::kernels::cuda_ops
