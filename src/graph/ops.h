// The built-in op (layer) library. Each factory returns a fresh op; shapes in
// the comments use the legend N/B batch, C channels, H/W spatial, T tokens,
// K classes, V vocabulary, P positions (or patch size, where it says so).
#pragma once

#include <array>
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

// Weight init N(0, std^2) with zero bias: the BERT / GPT-2 / ViT recipe (PyTorch's
// kaiming-uniform default otherwise).
struct NormalInit {
  double std = 0.02;
};

// x [..., in] -> [..., out]; weight [out, in], bias [out]
std::unique_ptr<Op> linear(int64_t in_features, int64_t out_features, Bias bias);
std::unique_ptr<Op> linear(int64_t in_features, int64_t out_features, Bias bias, NormalInit init);
// linear with bias, then GELU (tanh approximation) fused into the GEMM's epilogue
// (cuBLASLt's GELU_AUX_BIAS on CUDA): y = gelu_tanh(x W^T + b); the pre-activation is
// saved for backward. Same parameters, and on the CPU the same numbers, as linear +
// activation(gelu_tanh).
std::unique_ptr<Op> linear_gelu(int64_t in_features, int64_t out_features, NormalInit init);
// x [N, C, H, W] -> [N, K, OH, OW]; weight [K, C/groups, R, R]
std::unique_ptr<Op> conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel,
                           int64_t stride, int64_t pad, int64_t dilation = 1, int64_t groups = 1,
                           Bias bias = Bias::no, KaimingFan fan = KaimingFan::in);
// x [N, C, H, W] -> same; gamma, beta [C]; running mean/var are buffers.
// gamma_init is ones or zeros (zeros: a residual branch that starts as the identity).
std::unique_ptr<Op> batch_norm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f,
                                 InitKind gamma_init = InitKind::ones);
// batch_norm2d then ReLU as one op: the same bits, one pass on the CPU, and the
// pre-activation never stored (its output is the ReLU's).
std::unique_ptr<Op> batch_norm2d_relu(int64_t channels, float eps = 1e-5f, float momentum = 0.1f,
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
// x -> x in the graph's compute dtype (DTypePolicy); the identity's copy when it is x's.
std::unique_ptr<Op> to_compute_dtype();
// a, b (same shape) -> a + b
std::unique_ptr<Op> add();
// relu(a + b) as one op: the same bits, the sum never stored (a residual block's end).
std::unique_ptr<Op> add_relu();
// Whether self_attention takes a second input, the key-padding mask u8 [B, T]
// (1 = attend, 0 = padding).
enum class KeyMask : uint8_t { none, input };
// qkv [B, T, 3C] (q, k, v each [B, T, H, D], C = H * D) (, key mask u8 [B, T]) -> [B, T, C].
// Memory: the kernel tiles the keys with an online softmax and saves only the
// attention output and the row log-sum-exp f32 [B, H, T]; no B*H*T*T tensor
// exists in forward or backward (backward recomputes probabilities per tile).
// dropout: on the attention probabilities in training (BERT's and GPT-2's
// attention dropout), drawn inside the kernel per (op, step); eval has none.
// How self_attention splits its fused projection [B, T, 3 * hidden] into heads: viewed as
// [B, T, 3, H, D] and permuted to q, k, v [3, B, H, T, D] (kernels::permute's perm).
inline constexpr std::array<int, 5> kSplitHeads = {2, 0, 3, 1, 4};
std::unique_ptr<Op> self_attention(int64_t heads, kernels::Causal causal,
                                   KeyMask mask = KeyMask::none, float dropout = 0.0f);
// Whether token_embedding takes a second input, token-type ids i32 [B, T];
// without it every token is type 0 (the parameter still exists, as in BERT).
enum class TypeIds : uint8_t { none, input };
struct EmbeddingDims {
  int64_t vocab = 1;      // V
  int64_t positions = 1;  // P, at least T
  int64_t types = 0;      // token types; 0: no token-type table
  int64_t channels = 1;   // C
  double init_std = 0.02;
};
// ids i32 [B, T] (, type ids i32 [B, T]) -> word[id] + position[t] (+ token_type[type]) [B, T, C].
// Params word_embeddings.weight [V, C], position_embeddings.weight [P, C],
// token_type_embeddings.weight [types, C]; all N(0, init_std^2). An id outside
// the table is an Error naming the id and its position.
std::unique_ptr<Op> token_embedding(const EmbeddingDims& dims, TypeIds type_ids = TypeIds::none);
// images [N, C, H, W] -> patches [N, (H/P)*(W/P), C*P*P], patches row-major over
// the image, each flattened in (c, py, px) order: followed by linear(C*P*P, hidden)
// this is Conv2d(kernel = stride = P) with the conv weight [hidden, C, P, P] reshaped.
std::unique_ptr<Op> patchify(int64_t patch);
// x [N, T, C] -> [N, T + 1, C]: a learned class token prepended, then learned
// positions added. Params class_token [C] (zeros), position_embeddings [T + 1, C].
std::unique_ptr<Op> class_token_positions(int64_t tokens, int64_t channels, double init_std = 0.02);
// ids i32 [B, T] -> u8 [B, T]: 0 where the id is pad_id, else 1: self_attention's key
// mask for padded sequences (BERT classification). pad_id -1 masks nothing.
std::unique_ptr<Op> padding_mask(int64_t pad_id);
// x [B, T, C] -> x[:, index] [B, C] (BERT's pooler, ViT's class head)
std::unique_ptr<Op> select_token(int64_t index);
// x [B, T, C], labels i32 [B, T] -> rows [B, M, C], labels i32 [B, M]: the
// positions whose label is not ignore_index, in order, then padding rows (label
// ignore_index) where a sequence has fewer than M; more than M is an Error.
// BERT's masked-LM head runs on these M rows instead of all T.
std::unique_ptr<Op> gather_labeled(int64_t rows, int64_t ignore_index = -100);
// logits [..., K], labels i32 [...] -> mean loss f32 [1]
std::unique_ptr<Op> softmax_cross_entropy(int64_t ignore_index = -100,
                                          float label_smoothing = 0.0f);

}  // namespace dtrain::graph
