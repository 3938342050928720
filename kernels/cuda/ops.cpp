// kernels/cuda_ops.h for the elementwise family: unwraps the (already checked)
// Tensors into raw pointers and sizes and calls the launchers of
// kernels/cuda/<family>.cuh on the device's backend stream.
#include "kernels/cuda/context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {
cudaStream_t stream_of(const Tensor& t) { return Context::get(t.device().index).stream(); }
}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  launch_binary(BinaryOp::add, a.dtype(), 0.0f, a.raw(), b.raw(), out.raw(), a.numel(),
                stream_of(a));
}

void mul(const Tensor& a, const Tensor& b, Tensor& out) {
  launch_binary(BinaryOp::mul, a.dtype(), 0.0f, a.raw(), b.raw(), out.raw(), a.numel(),
                stream_of(a));
}

void scale(float alpha, const Tensor& x, Tensor& out) {
  launch_scale(x.dtype(), alpha, x.raw(), out.raw(), x.numel(), stream_of(x));
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  launch_binary(BinaryOp::axpy, x.dtype(), alpha, x.raw(), y.raw(), y.raw(), x.numel(),
                stream_of(x));
}

void fill(Tensor& x, float value) {
  launch_fill(x.dtype(), x.raw(), value, x.numel(), stream_of(x));
}

void bias_add(const BiasArgs& args, const Tensor& x, const Tensor& bias, Tensor& y) {
  launch_bias_add(x.dtype(), x.raw(), bias.raw(), y.raw(), args.outer, args.channels, args.inner,
                  stream_of(x));
}

void bias_add_backward(const BiasArgs& args, const Tensor& dy, Tensor& dbias) {
  launch_bias_add_backward(dy.dtype(), dy.raw(), dbias.raw(), args.outer, args.channels, args.inner,
                           stream_of(dy));
}

}  // namespace dtrain::kernels::cuda_ops
