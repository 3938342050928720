// The CUDA backend as the device-neutral entry points see it: host launchers
// taking Tensors (already checked by the caller: one device, dtypes, sizes).
// Implemented in kernels/cuda/*.cpp over the raw-pointer launchers of
// kernels/cuda/<family>.cuh, or by kernels/cuda_stub/cuda_ops.cpp, whose every
// function throws "built without CUDA". Only kernels/*.cpp call these.
#pragma once

#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/memory.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"

namespace dtrain::kernels::cuda_ops {

// cuBLASLt workspace asked for per GEMM: 32 MiB, NVIDIA's recommendation for
// Hopper (cuBLAS docs, "cublasSetWorkspace"); less is accepted and only narrows
// the algorithms cuBLASLt may choose.
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

Allocator& allocator(int device);
Allocator& pinned_host_allocator();
void copy(const Tensor& src, Tensor& dst, CopySync sync);
void synchronize(int device);

void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c, Workspace ws);

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
                                    const Tensor& targets, const Tensor& lse, float dloss,
                                    Tensor& dlogits);

// Ids are not read on the host: an id outside [0, vocab) fills its output row
// with 0xFF bytes (NaN) and adds nothing to dtable.
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);

void dropout_forward(const DropoutArgs& args, const Tensor& x, Tensor& y, Tensor& mask);
void dropout_backward(const DropoutArgs& args, const Tensor& dy, const Tensor& mask, Tensor& dx);

}  // namespace dtrain::kernels::cuda_ops
