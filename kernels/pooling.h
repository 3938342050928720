// 2-D max and average pooling over NCHW, and global average pooling
// ([N, C, HW] -> [N, C]). Max pooling saves the argmax (flat index into the
// input plane, i32) for backward; average pooling can count padding or not.
#pragma once

#include "kernels/common.h"

namespace dtrain::kernels {

enum class PoolKind : uint8_t { max, avg };
enum class PadCount : uint8_t { exclude, include };  // does padding count in the average?

struct Pool2dArgs {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  PadCount pad_count = PadCount::exclude;
  // 0: x, y, argmax, dy, dx are NCHW; B (8 or 16, f32 or bf16 on the CPU): channel-blocked
  // [N, C/B, H, W, B] (argmax too, still indexing h * W + w), C a multiple of B.
  int64_t block = 0;

  int64_t out_h() const { return (h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// x [N, C, H, W] -> y [N, C, OH, OW]; argmax i32 [N, C, OH, OW] (max only; ignored for avg)
void pool2d_forward(PoolKind kind, const Pool2dArgs& args, const Tensor& x, Tensor& y,
                    Tensor& argmax);
// dy [N, C, OH, OW] -> dx [N, C, H, W] (overwritten)
void pool2d_backward(PoolKind kind, const Pool2dArgs& args, const Tensor& dy, const Tensor& argmax,
                     Tensor& dx);

// x [N, C, HW] (block B > 0: [N, C/B, HW, B], f32 or bf16 on the CPU) -> y [N, C]
void global_avg_pool_forward(int64_t n, int64_t c, int64_t hw, const Tensor& x, Tensor& y,
                             int64_t block = 0);
// dy [N, C] -> dx [N, C, HW] (or blocked, as forward's x)
void global_avg_pool_backward(int64_t n, int64_t c, int64_t hw, const Tensor& dy, Tensor& dx,
                              int64_t block = 0);

}  // namespace dtrain::kernels
