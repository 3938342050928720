// 2-D convolution (cross-correlation, as every framework defines it): forward,
// backward-data and backward-filter, with stride, padding, dilation and groups.
// Layout NCHW (or channel-blocked, Conv2dArgs::x_block) for activations and KCRS
// ([K, C/groups, R, S]) for filters. No
// bias here (use bias_add). CPU: oneDNN; any reorder buffers come from the workspace.
// CUDA: cuDNN (kernels/cuda/conv.cpp).
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

struct Conv2dArgs {
  int64_t n = 1, c = 1, h = 1, w = 1;  // input  [N, C, H, W]
  int64_t k = 1, r = 1, s = 1;         // filter [K, C/groups, R, S]
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  MathMode math = MathMode::fp32;  // tf32: f32 convolutions may use TF32 on CUDA
  // How x / dx and y / dy lie in memory (CPU, f32 or bf16): 0 is NCHW; B (8 or 16) is
  // channel-blocked NCHW[B]c, [N, C/B, H, W, B] (C, or K, a multiple of B): what
  // cpu_channel_block() says this CPU's primitives compute in, so none is reordered.
  int64_t x_block = 0, y_block = 0;

  int64_t out_h() const { return (h + 2 * pad_h - dilation_h * (r - 1) - 1) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - dilation_w * (s - 1) - 1) / stride_w + 1; }
  double flops() const;  // forward multiply-adds x 2
};

// The channel block oneDNN's f32 convolutions want activations in on this CPU (8 with
// AVX2, 16 with AVX-512), or 0 when they want no channel-blocked layout. Probed once.
int64_t cpu_channel_block();
// The block activations of `dtype` are kept in: f32's above; bf16's the same where
// oneDNN computes bf16 convolutions in bf16 on this CPU with that block (else they widen
// to f32 whatever the layout), else 0; 0 for other dtypes.
int64_t cpu_channel_block(DType dtype);

// Bytes of workspace each direction needs (the max over the three is safe). CPU:
// backward-filter's grows with the OpenMP thread count at the call (a gradient buffer
// for each task run at once); a smaller workspace runs fewer at once, at the same bits.
// CUDA: cuDNN's budget (a constant, so planning works without a GPU); the algorithm
// chosen for each shape fits it.
size_t conv2d_workspace_bytes(const Conv2dArgs& args, DType dtype, Device device = Device::cpu());

// x [N, C, H, W], w [K, C/g, R, S] -> y [N, K, OH, OW]
void conv2d_forward(const Conv2dArgs& args, const Tensor& x, const Tensor& w, Tensor& y,
                    Workspace ws);
// dy [N, K, OH, OW], w -> dx [N, C, H, W] (overwritten)
void conv2d_backward_data(const Conv2dArgs& args, const Tensor& dy, const Tensor& w, Tensor& dx,
                          Workspace ws);
// x, dy -> dw [K, C/g, R, S] (overwritten). CPU: the same bits at any thread count.
void conv2d_backward_filter(const Conv2dArgs& args, const Tensor& x, const Tensor& dy, Tensor& dw,
                            Workspace ws);

}  // namespace dtrain::kernels
