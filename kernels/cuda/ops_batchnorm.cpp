// kernels/cuda_ops.h for batch normalisation: unwraps the (already checked)
// Tensors into the raw launchers of kernels/cuda/batchnorm.cuh on the device's
// backend stream.
#include "kernels/cuda/batchnorm.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

BnShape shape_of(const BatchNormArgs& a) { return {a.n, a.c, a.hw, a.eps, a.momentum}; }

}  // namespace

void batch_norm_forward_train(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, Tensor& y, Tensor& running_mean,
                              Tensor& running_var, Tensor& save_mean, Tensor& save_invstd) {
  launch_batch_norm_forward_train(x.dtype(), shape_of(args), x.raw(), f32(gamma), f32(beta),
                                  y.raw(), f32(running_mean), f32(running_var), f32(save_mean),
                                  f32(save_invstd), stream_of(x));
}

void batch_norm_forward_infer(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, const Tensor& running_mean,
                              const Tensor& running_var, Tensor& y) {
  launch_batch_norm_forward_infer(x.dtype(), shape_of(args), x.raw(), f32(gamma), f32(beta),
                                  f32(running_mean), f32(running_var), y.raw(), stream_of(x));
}

void batch_norm_backward(const BatchNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  launch_batch_norm_backward(x.dtype(), shape_of(args), x.raw(), dy.raw(), f32(gamma),
                             f32(save_mean), f32(save_invstd), dx.raw(), f32(dgamma), f32(dbeta),
                             stream_of(x));
}

}  // namespace dtrain::kernels::cuda_ops
