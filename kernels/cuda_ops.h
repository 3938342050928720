// The CUDA backend as the device-neutral entry points see it: host launchers
// taking Tensors (already checked by the caller: one device, dtypes, sizes).
// Implemented in kernels/cuda/*.cpp over the raw-pointer launchers of
// kernels/cuda/<family>.cuh, or by kernels/cuda_stub/cuda_ops.cpp, whose every
// function throws "built without CUDA". Only kernels/*.cpp (and tests) call these.
#pragma once

#include <array>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/batchnorm.h"
#include "kernels/compress.h"
#include "kernels/conv.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/memory.h"
#include "kernels/optimizer.h"
#include "kernels/pooling.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"

namespace dtrain::kernels::cuda_ops {

// cuBLASLt workspace asked for per GEMM: 32 MiB, NVIDIA's recommendation for
// Hopper (cuBLAS docs, "cublasSetWorkspace"); less is accepted and only narrows
// the algorithms cuBLASLt may choose.
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
// cuDNN convolution workspace budget per call: algorithms needing more are not
// chosen (kernels/cuda/conv.cpp), so planning knows the bytes without a GPU.
inline constexpr size_t kConvWorkspaceBytes = size_t{256} << 20;

Allocator& allocator(int device);
Allocator& pinned_host_allocator();
void set_pool_caching(int device, bool on);
void copy(const Tensor& src, Tensor& dst, CopySync sync);
void synchronize(int device);
void upload(const Tensor& pinned_src, Tensor& dst);

void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c, Workspace ws,
          const Tensor& bias, const Tensor& pre);

void activation_forward(Activation act, const Tensor& x, Tensor& y);
void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);

void add(const Tensor& a, const Tensor& b, Tensor& out);
void mul(const Tensor& a, const Tensor& b, Tensor& out);
void scale(float alpha, const Tensor& x, Tensor& out);
void axpy(float alpha, const Tensor& x, Tensor& y);
void fill(Tensor& x, float value);
void bias_add(const BiasArgs& args, const Tensor& x, const Tensor& bias, Tensor& y);
void bias_add_backward(const BiasArgs& args, const Tensor& dy, Tensor& dbias);
void cast(const Tensor& src, Tensor& dst);

void reduce(Reduction op, const Tensor& x, Tensor& out, Workspace ws);

// y = x permuted: y's dims and, per y dim, the stride of x it walks (rank <= 6).
void permute(const Tensor& x, const std::array<int64_t, 6>& out_dim,
             const std::array<int64_t, 6>& src_stride, Tensor& y);

void pool2d_forward(PoolKind kind, const Pool2dArgs& args, const Tensor& x, Tensor& y,
                    Tensor& argmax);
void pool2d_backward(PoolKind kind, const Pool2dArgs& args, const Tensor& dy, const Tensor& argmax,
                     Tensor& dx);
void global_avg_pool_forward(int64_t n, int64_t c, int64_t hw, const Tensor& x, Tensor& y);
void global_avg_pool_backward(int64_t n, int64_t c, int64_t hw, const Tensor& dy, Tensor& dx);

void batch_norm_forward_train(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, Tensor& y, Tensor& running_mean,
                              Tensor& running_var, Tensor& save_mean, Tensor& save_invstd);
void batch_norm_forward_infer(const BatchNormArgs& args, const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, const Tensor& running_mean,
                              const Tensor& running_var, Tensor& y);
void batch_norm_backward(const BatchNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta);

void conv2d_forward(const Conv2dArgs& args, const Tensor& x, const Tensor& w, Tensor& y,
                    Workspace ws);
void conv2d_backward_data(const Conv2dArgs& args, const Tensor& dy, const Tensor& w, Tensor& dx,
                          Workspace ws);
void conv2d_backward_filter(const Conv2dArgs& args, const Tensor& x, const Tensor& dy, Tensor& dw,
                            Workspace ws);

// Attention's backward workspace on CUDA: Di = rowsum(dO * O), f32 [B, H, Tq]
// (a formula, so planning works without a GPU). Forward needs none.
inline size_t attention_workspace_bytes_cuda(const AttentionArgs& a) {
  return static_cast<size_t>(a.b * a.h * a.tq) * sizeof(float);
}
void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_mask, Tensor& out, Tensor& lse);
void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& key_mask, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        Workspace ws);
void layer_norm_forward(const LayerNormArgs& args, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, Tensor& y, Tensor& save_mean, Tensor& save_rstd);
void layer_norm_backward(const LayerNormArgs& args, const Tensor& x, const Tensor& dy,
                         const Tensor& gamma, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor& dx, Tensor& dgamma, Tensor& dbeta);

// Targets are not read on the host (that would be a hidden copy and a sync):
// an invalid one makes the loss NaN and its dlogits row NaN.
void softmax_forward(int64_t rows, int64_t cols, const Tensor& x, Tensor& y);
void softmax_backward(int64_t rows, int64_t cols, const Tensor& y, const Tensor& dy, Tensor& dx);
void softmax_cross_entropy_forward(const CrossEntropyArgs& args, const Tensor& logits,
                                   const Tensor& targets, Tensor& loss, Tensor& lse);
void softmax_cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& logits,
                                    const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                                    Tensor& dlogits);

// Ids are not read on the host: an id outside [0, vocab) fills its output row
// with 0xFF bytes (NaN) and adds nothing to dtable.
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);
void labeled_rows(const Tensor& labels, int64_t ignore_index, Tensor& ids, Tensor& out);
void padding_mask(const Tensor& ids, int32_t pad_id, Tensor& mask);

void dropout_forward(const DropoutArgs& args, const Tensor& x, Tensor& y, Tensor& mask);
void dropout_backward(const DropoutArgs& args, const Tensor& dy, const Tensor& mask, Tensor& dx);

static_assert(static_cast<int>(SgdMomentum::none) == 0 &&
              static_cast<int>(SgdMomentum::heavy_ball) == 1 &&
              static_cast<int>(SgdMomentum::nesterov) == 2);  // kernels/cuda/optimizer.cu
void sgd_step(const SgdStep& k, Tensor& p, const Tensor& g, Tensor& momentum, Tensor* copy);
void adamw_step(const AdamStep& k, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor* copy);
void ema_update(float rest, const Tensor& p, Tensor& ema);
void lamb_moments(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& p,
                  const Tensor& g, Tensor& m, Tensor& v, Tensor& sums);
void lamb_update(const AdamStep& k, const Tensor& ranges, const Tensor& wd, const Tensor& step,
                 Tensor& p, const Tensor& m, const Tensor& v);

// Gradient compression (kernels/compress.h). topk's workspace holds the radix sort's
// keys and indices and CUB's own temporary storage (asked of CUB: needs the runtime).
size_t topk_workspace_bytes(int64_t n);
void topk_select(const Tensor& x, Tensor& indices, Tensor& values, Workspace ws);
// An index outside [0, out.numel()) is skipped (not read back on the host).
void scatter_add(const Tensor& indices, const Tensor& values, int64_t segment, Tensor& out);
void clear_at(const Tensor& indices, Tensor& x);
void sign_pack(const Tensor& x, int64_t chunk, Tensor& words, Tensor& scales);
void sign_unpack(const Tensor& words, const Tensor& scales, int64_t chunk, Tensor& out, bool add);
void orthonormalize_columns(Tensor& a);

}  // namespace dtrain::kernels::cuda_ops
