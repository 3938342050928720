// Device dispatch of the kernel entry points, on any machine: kernels given
// tensors on mixed devices, GEMM/conv/attention workspace planning, and
// (without a usable GPU) copies, allocators and CUDA kernels all fail with a
// clear dtrain error instead of crashing. CUDA tensors here wrap a fake
// address: nothing may dereference it.
#include <doctest/doctest.h>

#include <array>
#include <string>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/cuda_ops.h"
#include "kernels/device_info.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/layout.h"
#include "kernels/memory.h"
#include "kernels/optimizer.h"
#include "kernels/pooling.h"
#include "kernels/softmax.h"

using namespace dtrain;
using namespace dtrain::kernels;

namespace {

void* fake_device_address() { return reinterpret_cast<void*>(uintptr_t{0xdead0000}); }

Tensor cuda_tensor(const Shape& s) {
  return Tensor::wrap(fake_device_address(), s, DType::f32, Device::cuda(0));
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message() + " | " + e.hint();
  }
  return "no error";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// What a CUDA call says on this machine when no device can be used.
std::string no_gpu_reason() {
  return query_cuda().built ? "no CUDA device available" : "built without CUDA";
}

}  // namespace

TEST_CASE("tensors on different devices are refused, naming both") {
  Tensor a = Tensor::empty(Shape{4}, DType::f32);
  Tensor b = cuda_tensor(Shape{4});
  Tensor out = Tensor::empty(Shape{4}, DType::f32);
  const std::string msg = error_of([&] { add(a, b, out); });
  CHECK(has(msg, "kernel add: tensors on different devices"));
  CHECK(has(msg, "cpu"));
  CHECK(has(msg, "cuda:0"));
}

TEST_CASE("GEMM workspace on CUDA is a planning constant, known without a GPU") {
  GemmArgs g;
  g.m = g.n = g.k = 64;
  CHECK(gemm_workspace_bytes(g, DType::bf16, DType::f32, Device::cuda()) ==
        cuda_ops::kGemmWorkspaceBytes);
  g.k = 0;
  CHECK(gemm_workspace_bytes(g, DType::bf16, DType::f32, Device::cuda()) == 0);
}

TEST_CASE("without a usable GPU, CUDA work fails with CUDA's reason") {
  if (query_cuda().available) return;  // the gpu-labelled kernel tests cover this machine
  const std::string reason = no_gpu_reason();
  Tensor host = Tensor::empty(Shape{4}, DType::f32);
  Tensor dev = cuda_tensor(Shape{4});

  CHECK_THROWS_AS(copy(host, dev), RunError);
  CHECK(has(error_of([&] { copy(host, dev); }), reason));
  CHECK(has(error_of([&] { copy(dev, host); }), reason));
  CHECK(has(error_of([&] { device_allocator(Device::cuda(0)); }), reason));
  CHECK(has(error_of([&] { pinned_host_allocator(); }), reason));
  CHECK(has(error_of([&] { synchronize(Device::cuda(0)); }), reason));
  // Implemented families reach the CUDA backend, which reports the same.
  Tensor y = cuda_tensor(Shape{4});
  CHECK(has(error_of([&] { add(dev, dev, y); }), reason));
  CHECK(has(error_of([&] { activation_forward(Activation::gelu_tanh, dev, y); }), reason));
  CHECK(has(error_of([&] { cast(dev, y); }), reason));
  const std::array<int, 1> perm{0};
  CHECK(has(error_of([&] { permute(dev, perm, y); }), reason));
  Tensor two = cuda_tensor(Shape{2});
  Tensor stats = cuda_tensor(Shape{2});
  CHECK(has(error_of([&] { layer_norm_forward({2, 2}, dev, two, two, y, stats, stats); }), reason));
  CHECK(has(error_of([&] { softmax_forward(2, 2, dev, y); }), reason));
  Tensor ids = Tensor::wrap(fake_device_address(), Shape{2}, DType::i32, Device::cuda(0));
  CHECK(has(error_of([&] { embedding_forward(ids, cuda_tensor(Shape{2, 2}), y); }), reason));
  Tensor mask = Tensor::wrap(fake_device_address(), Shape{4}, DType::u8, Device::cuda(0));
  CHECK(has(error_of([&] { dropout_forward({0.5f}, dev, y, mask); }), reason));
  GemmArgs g;
  g.m = g.n = g.k = 2;
  CHECK(has(error_of([&] { gemm(g, dev, dev, y, Workspace{}); }), reason));
  CHECK(has(error_of([&] { global_avg_pool_forward(1, 4, 1, dev, y); }), reason));
  Conv2dArgs conv;
  conv.h = conv.w = 2;
  Tensor w1 = cuda_tensor(Shape{1});
  CHECK(has(error_of([&] { conv2d_forward(conv, dev, w1, y, Workspace{}); }), reason));
  CHECK(conv2d_workspace_bytes(conv, DType::f32, Device::cuda()) == cuda_ops::kConvWorkspaceBytes);
  AttentionArgs attn;  // b = h = tq = tk = d = 1
  Tensor lse = cuda_tensor(Shape{1});
  Tensor no_mask;
  CHECK(has(error_of([&] { attention_forward(attn, w1, w1, w1, no_mask, w1, lse, Workspace{}); }),
            reason));
  CHECK(has(error_of([&] { sgd_step(SgdStep{}, dev, dev, y); }), reason));
  CHECK(has(error_of([&] { adamw_step(AdamStep{}, dev, dev, y, y); }), reason));
  BatchNormArgs bn;
  bn.c = 4;
  Tensor per_c = cuda_tensor(Shape{4}), out = cuda_tensor(Shape{4});
  CHECK(has(error_of([&] { batch_norm_forward_infer(bn, dev, per_c, per_c, per_c, per_c, out); }),
            reason));
  Pool2dArgs pool;
  pool.h = pool.w = 2;
  Tensor no_argmax;
  CHECK(has(error_of([&] { pool2d_forward(PoolKind::avg, pool, dev, y, no_argmax); }), reason));
  if (!query_cuda().built) {
    CHECK(has(error_of([&] { copy(host, dev); }), "rebuild with -DDTRAIN_CUDA=ON"));
  }
}

TEST_CASE("host to host copy needs no CUDA and checks dtype and size") {
  Tensor a = Tensor::empty(Shape{3}, DType::f32);
  Tensor b = Tensor::empty(Shape{3}, DType::f32);
  for (int i = 0; i < 3; ++i) a.data<float>()[i] = static_cast<float>(i) + 0.5f;
  copy(a, b);
  CHECK(b.data<float>()[2] == 2.5f);
  synchronize(Device::cpu());
  Tensor c = Tensor::empty(Shape{3}, DType::f16);
  CHECK_THROWS_AS(copy(a, c), InternalError);
}
