// kernels/cuda_ops.h for the pointwise families and permute: unwraps the (already checked)
// Tensors into raw pointers and sizes and calls the launchers of
// kernels/cuda/<family>.cuh on the device's backend stream.
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/layout.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

static_assert(static_cast<int>(ActKind::relu) == static_cast<int>(Activation::relu) &&
              static_cast<int>(ActKind::gelu_tanh) == static_cast<int>(Activation::gelu_tanh) &&
              static_cast<int>(ActKind::gelu_erf) == static_cast<int>(Activation::gelu_erf) &&
              static_cast<int>(ActKind::tanh) == static_cast<int>(Activation::tanh));
static_assert(static_cast<int>(ReduceKind::sum) == static_cast<int>(Reduction::sum) &&
              static_cast<int>(ReduceKind::mean) == static_cast<int>(Reduction::mean) &&
              static_cast<int>(ReduceKind::l2_norm) == static_cast<int>(Reduction::l2_norm) &&
              static_cast<int>(ReduceKind::max_abs) == static_cast<int>(Reduction::max_abs) &&
              static_cast<int>(ReduceKind::has_inf_or_nan) ==
                  static_cast<int>(Reduction::has_inf_or_nan));

void activation_forward(Activation act, const Tensor& x, Tensor& y) {
  launch_activation_forward(static_cast<ActKind>(act), x.dtype(), x.raw(), y.raw(), x.numel(),
                            stream_of(x));
}

void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  launch_activation_backward(static_cast<ActKind>(act), x.dtype(), x.raw(), dy.raw(), dx.raw(),
                             x.numel(), stream_of(x));
}

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

void cast(const Tensor& src, Tensor& dst) {
  launch_cast(src.dtype(), src.raw(), dst.dtype(), dst.raw(), src.numel(), stream_of(src));
}

void reduce(Reduction op, const Tensor& x, Tensor& out, Workspace ws) {
  const int64_t blocks = (x.numel() + kReduceBlock - 1) / kReduceBlock;
  size_t offset = 0;
  double* partials = ws.take<double>(offset, static_cast<size_t>(blocks));
  launch_reduce(static_cast<ReduceKind>(op), x.dtype(), x.raw(), x.numel(), partials,
                static_cast<float*>(out.raw()), stream_of(x));
}

void permute(const Tensor& x, const std::array<int64_t, 6>& out_dim,
             const std::array<int64_t, 6>& src_stride, Tensor& y) {
  static_assert(kMaxPermuteRank == 6);
  PermuteGeometry g;
  g.rank = x.rank();
  for (int i = 0; i < g.rank; ++i) {
    g.out_dim[i] = out_dim[i];
    g.src_stride[i] = src_stride[i];
  }
  launch_permute(g, dtype_size(x.dtype()), x.raw(), y.raw(), y.numel(), stream_of(x));
}

}  // namespace dtrain::kernels::cuda_ops
