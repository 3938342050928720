// The built-in op (layer) library. Each factory returns a fresh op; shapes in
// the comments use the legend N batch, C channels, H/W spatial, T tokens, K classes.
#pragma once

#include <memory>

#include "graph/op.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/pooling.h"

namespace dtrain::graph {

enum class Bias : uint8_t { no, yes };
// The fan a Kaiming-normal weight init divides by: in = C/groups*R*R (PyTorch's
// default), out = K*R*R (torchvision's ResNet init, mode="fan_out").
enum class KaimingFan : uint8_t { in, out };

// x [..., in] -> [..., out]; weight [out, in], bias [out]
std::unique_ptr<Op> linear(int64_t in_features, int64_t out_features, Bias bias);
// x [N, C, H, W] -> [N, K, OH, OW]; weight [K, C/groups, R, R]
std::unique_ptr<Op> conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel,
                           int64_t stride, int64_t pad, int64_t dilation = 1, int64_t groups = 1,
                           Bias bias = Bias::no, KaimingFan fan = KaimingFan::in);
// x [N, C, H, W] -> same; gamma, beta [C]; running mean/var are buffers.
// gamma_init is ones or zeros (zeros: a residual branch that starts as the identity).
std::unique_ptr<Op> batch_norm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f,
                                 InitKind gamma_init = InitKind::ones);
// x [..., C] -> same
std::unique_ptr<Op> layer_norm(int64_t channels, float eps = 1e-5f);
std::unique_ptr<Op> activation(kernels::Activation act);
std::unique_ptr<Op> dropout(float p);
// x [N, C, H, W] -> [N, C, OH, OW]
std::unique_ptr<Op> pool2d(kernels::PoolKind kind, int64_t kernel, int64_t stride, int64_t pad);
// x [N, C, H, W] -> [N, C]
std::unique_ptr<Op> global_avg_pool();
// x [N, ...] -> [N, prod(...)]
std::unique_ptr<Op> flatten();
// a, b (same shape) -> a + b
std::unique_ptr<Op> add();
// qkv [B, T, 3C] (q, k, v each [B, T, H, D], C = H * D) -> [B, T, C]
std::unique_ptr<Op> self_attention(int64_t heads, kernels::Causal causal);
// logits [..., K], labels i32 [...] -> mean loss f32 [1]
std::unique_ptr<Op> softmax_cross_entropy(int64_t ignore_index = -100,
                                          float label_smoothing = 0.0f);

}  // namespace dtrain::graph
