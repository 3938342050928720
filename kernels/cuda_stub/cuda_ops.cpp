// kernels/cuda_ops.h for builds without CUDA: a CUDA tensor can still be
// described (Device::cuda, Tensor::wrap), but every launcher throws a RunError
// saying how to get a CUDA build. Planning (gemm_workspace_bytes) still works.
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {
[[noreturn]] void no_cuda(std::string_view what) {
  throw RunError(fmt::format("{} needs CUDA, but dtrain was built without CUDA", what),
                 "rebuild with -DDTRAIN_CUDA=ON (needs nvcc, see shared/PLATFORM.md)");
}
}  // namespace

Allocator& allocator(int device) { no_cuda(fmt::format("memory on cuda:{}", device)); }
Allocator& pinned_host_allocator() { no_cuda("pinned host memory"); }
void set_pool_caching(int device, bool) { no_cuda(fmt::format("memory on cuda:{}", device)); }
void copy(const Tensor& src, Tensor& dst, CopySync) {
  no_cuda(fmt::format("copy {} -> {}", src.str(), dst.str()));
}
void synchronize(int device) { no_cuda(fmt::format("synchronize cuda:{}", device)); }
void upload(const Tensor& src, Tensor& dst) {
  no_cuda(fmt::format("upload {} -> {}", src.str(), dst.str()));
}

void gemm(const GemmArgs&, const Tensor&, const Tensor&, Tensor&, Workspace, const Tensor&,
          const Tensor&) {
  no_cuda("gemm");
}

void activation_forward(Activation, const Tensor&, Tensor&) { no_cuda("activation_forward"); }
void activation_backward(Activation, const Tensor&, const Tensor&, Tensor&) {
  no_cuda("activation_backward");
}

void add(const Tensor&, const Tensor&, Tensor&) { no_cuda("add"); }
void mul(const Tensor&, const Tensor&, Tensor&) { no_cuda("mul"); }
void scale(float, const Tensor&, Tensor&) { no_cuda("scale"); }
void axpy(float, const Tensor&, Tensor&) { no_cuda("axpy"); }
void fill(Tensor&, float) { no_cuda("fill"); }
void bias_add(const BiasArgs&, const Tensor&, const Tensor&, Tensor&) { no_cuda("bias_add"); }
void bias_add_backward(const BiasArgs&, const Tensor&, Tensor&) { no_cuda("bias_add_backward"); }
void cast(const Tensor&, Tensor&) { no_cuda("cast"); }

void reduce(Reduction, const Tensor&, Tensor&, Workspace) { no_cuda("reduce"); }

void permute(const Tensor&, const std::array<int64_t, 6>&, const std::array<int64_t, 6>&, Tensor&) {
  no_cuda("permute");
}

void pool2d_forward(PoolKind, const Pool2dArgs&, const Tensor&, Tensor&, Tensor&) {
  no_cuda("pool2d_forward");
}
void pool2d_backward(PoolKind, const Pool2dArgs&, const Tensor&, const Tensor&, Tensor&) {
  no_cuda("pool2d_backward");
}
void global_avg_pool_forward(int64_t, int64_t, int64_t, const Tensor&, Tensor&) {
  no_cuda("global_avg_pool_forward");
}
void global_avg_pool_backward(int64_t, int64_t, int64_t, const Tensor&, Tensor&) {
  no_cuda("global_avg_pool_backward");
}

void batch_norm_forward_train(const BatchNormArgs&, const Tensor&, const Tensor&, const Tensor&,
                              Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
  no_cuda("batch_norm_forward_train");
}
void batch_norm_forward_infer(const BatchNormArgs&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, Tensor&) {
  no_cuda("batch_norm_forward_infer");
}
void batch_norm_backward(const BatchNormArgs&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  no_cuda("batch_norm_backward");
}

void conv2d_forward(const Conv2dArgs&, const Tensor&, const Tensor&, Tensor&, Workspace) {
  no_cuda("conv2d_forward");
}
void conv2d_backward_data(const Conv2dArgs&, const Tensor&, const Tensor&, Tensor&, Workspace) {
  no_cuda("conv2d_backward_data");
}
void conv2d_backward_filter(const Conv2dArgs&, const Tensor&, const Tensor&, Tensor&, Workspace) {
  no_cuda("conv2d_backward_filter");
}

void attention_forward(const AttentionArgs&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, Tensor&, Tensor&) {
  no_cuda("attention_forward");
}
void attention_backward(const AttentionArgs&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                        Tensor&, Tensor&, Workspace) {
  no_cuda("attention_backward");
}

void layer_norm_forward(const LayerNormArgs&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                        Tensor&, Tensor&) {
  no_cuda("layer_norm_forward");
}
void layer_norm_backward(const LayerNormArgs&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  no_cuda("layer_norm_backward");
}

void softmax_forward(int64_t, int64_t, const Tensor&, Tensor&) { no_cuda("softmax_forward"); }
void softmax_backward(int64_t, int64_t, const Tensor&, const Tensor&, Tensor&) {
  no_cuda("softmax_backward");
}
void softmax_cross_entropy_forward(const CrossEntropyArgs&, const Tensor&, const Tensor&, Tensor&,
                                   Tensor&) {
  no_cuda("softmax_cross_entropy_forward");
}
void softmax_cross_entropy_backward(const CrossEntropyArgs&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, Tensor&) {
  no_cuda("softmax_cross_entropy_backward");
}

void embedding_forward(const Tensor&, const Tensor&, Tensor&) { no_cuda("embedding_forward"); }
void embedding_backward(const Tensor&, const Tensor&, Tensor&) { no_cuda("embedding_backward"); }
void labeled_rows(const Tensor&, int64_t, Tensor&, Tensor&) { no_cuda("labeled_rows"); }
void padding_mask(const Tensor&, int32_t, Tensor&) { no_cuda("padding_mask"); }

void dropout_forward(const DropoutArgs&, const Tensor&, Tensor&, Tensor&) {
  no_cuda("dropout_forward");
}
void dropout_backward(const DropoutArgs&, const Tensor&, const Tensor&, Tensor&) {
  no_cuda("dropout_backward");
}

void sgd_step(const SgdStep&, Tensor&, const Tensor&, Tensor&, Tensor*) { no_cuda("sgd_step"); }
void adamw_step(const AdamStep&, Tensor&, const Tensor&, Tensor&, Tensor&, Tensor*) {
  no_cuda("adamw_step");
}
void lamb_moments(const AdamStep&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  Tensor&, Tensor&, Tensor&) {
  no_cuda("lamb_moments");
}
void ema_update(float, const Tensor&, Tensor&) { no_cuda("ema_update"); }
void lamb_update(const AdamStep&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                 const Tensor&, const Tensor&) {
  no_cuda("lamb_update");
}

size_t topk_workspace_bytes(int64_t) { no_cuda("topk_workspace_bytes"); }
void topk_select(const Tensor&, Tensor&, Tensor&, Workspace) { no_cuda("topk_select"); }
void scatter_add(const Tensor&, const Tensor&, int64_t, Tensor&) { no_cuda("scatter_add"); }
void clear_at(const Tensor&, Tensor&) { no_cuda("clear_at"); }
void sign_pack(const Tensor&, int64_t, Tensor&, Tensor&) { no_cuda("sign_pack"); }
void sign_unpack(const Tensor&, const Tensor&, int64_t, Tensor&, bool) { no_cuda("sign_unpack"); }
void orthonormalize_columns(Tensor&) { no_cuda("orthonormalize_columns"); }

}  // namespace dtrain::kernels::cuda_ops
