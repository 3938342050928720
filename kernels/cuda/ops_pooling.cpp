// kernels/cuda_ops.h for pooling: unwraps the (already checked) Tensors and
// kernels::Pool2dArgs into the raw launchers of kernels/cuda/pooling.cuh on the
// device's backend stream.
#include "kernels/cuda/context.h"
#include "kernels/cuda/pooling.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

PoolShape shape_of(const Pool2dArgs& a) {
  return {a.n * a.c,  a.h,        a.w,        a.out_h(),
          a.out_w(),  a.kernel_h, a.kernel_w, a.stride_h,
          a.stride_w, a.pad_h,    a.pad_w,    a.pad_count == PadCount::include};
}

PoolOp op_of(PoolKind kind) { return kind == PoolKind::max ? PoolOp::max : PoolOp::avg; }

}  // namespace

void pool2d_forward(PoolKind kind, const Pool2dArgs& args, const Tensor& x, Tensor& y,
                    Tensor& argmax) {
  int32_t* am = kind == PoolKind::max ? static_cast<int32_t*>(argmax.raw()) : nullptr;
  launch_pool2d_forward(op_of(kind), x.dtype(), shape_of(args), x.raw(), y.raw(), am, stream_of(x));
}

void pool2d_backward(PoolKind kind, const Pool2dArgs& args, const Tensor& dy, const Tensor& argmax,
                     Tensor& dx) {
  const int32_t* am = kind == PoolKind::max ? static_cast<const int32_t*>(argmax.raw()) : nullptr;
  launch_pool2d_backward(op_of(kind), dy.dtype(), shape_of(args), dy.raw(), am, dx.raw(),
                         stream_of(dy));
}

void global_avg_pool_forward(int64_t n, int64_t c, int64_t hw, const Tensor& x, Tensor& y) {
  launch_global_avg_pool_forward(x.dtype(), n * c, hw, x.raw(), y.raw(), stream_of(x));
}

void global_avg_pool_backward(int64_t n, int64_t c, int64_t hw, const Tensor& dy, Tensor& dx) {
  launch_global_avg_pool_backward(dy.dtype(), n * c, hw, dy.raw(), dx.raw(), stream_of(dy));
}

}  // namespace dtrain::kernels::cuda_ops
