// CUDA 2-D convolution through cuDNN 9's convolution API, with kernels/conv.h's
// semantics: NCHW activations, KCRS filters, cross-correlation, stride, padding,
// dilation and groups; f32 / f16 / bf16 storage, f32 compute. f32 uses FMA maths
// only unless args.math is MathMode::tf32 (as GEMM); half types may use tensor cores. The algorithm
// of each (shape, dtype, direction) is cuDNN's heuristic ranking filtered to deterministic
// algorithms whose workspace fits kConvWorkspaceBytes, chosen once and cached, so
// the same job gives the same bits; the workspace comes from the caller.
#include <cudnn.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels::cuda_ops {

namespace {

enum class ConvDir : uint8_t { forward, backward_data, backward_filter };

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;  // input-like, output-like
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;  // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t of the plan's direction
  size_t workspace = 0;
};

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      DTRAIN_CHECK(false, "conv2d: no cuDNN type for {}", dtype_name(t));
  }
  return CUDNN_DATA_FLOAT;
}

int as_int(int64_t v, const char* what) {
  DTRAIN_CHECK(v >= 0 && v <= INT32_MAX, "conv2d: {} = {} does not fit cuDNN's int", what, v);
  return static_cast<int>(v);
}

std::string key_of(const Conv2dArgs& a, DType t, ConvDir dir, int device) {
  return fmt::format("{} n{} c{} h{} w{} k{} r{} s{} st{},{} p{},{} d{},{} g{} {} math{} dev{}",
                     static_cast<int>(dir), a.n, a.c, a.h, a.w, a.k, a.r, a.s, a.stride_h,
                     a.stride_w, a.pad_h, a.pad_w, a.dilation_h, a.dilation_w, a.groups,
                     dtype_name(t), static_cast<int>(a.math), device);
}

// The first of cuDNN's ranked candidates that ran, is deterministic and fits the budget.
template <typename Perf>
const Perf* pick(const Perf* perf, int count, DType t, MathMode math) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC) continue;
    if (p.memory > kConvWorkspaceBytes) continue;
    // DEFAULT_MATH permits TF32 on Ampere and later: f32 takes FMA maths only,
    // unless the job allows TF32.
    if (t == DType::f32 && math == MathMode::fp32 && p.mathType != CUDNN_FMA_MATH) continue;
    return &p;
  }
  return nullptr;
}

std::unique_ptr<ConvPlan> make_plan(const Conv2dArgs& a, DType t, ConvDir dir,
                                    cudnnHandle_t handle) {
  auto p = std::make_unique<ConvPlan>();
  const cudnnDataType_t type = cudnn_type(t);
  DTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  DTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  DTRAIN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  DTRAIN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
  DTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, type, as_int(a.n, "n"),
                                                as_int(a.c, "c"), as_int(a.h, "h"),
                                                as_int(a.w, "w")));
  DTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, type, as_int(a.n, "n"),
                                                as_int(a.k, "k"), as_int(a.out_h(), "out_h"),
                                                as_int(a.out_w(), "out_w")));
  DTRAIN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, type, CUDNN_TENSOR_NCHW, as_int(a.k, "k"),
                                                as_int(a.c / a.groups, "c/groups"),
                                                as_int(a.r, "r"), as_int(a.s, "s")));
  DTRAIN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      p->conv, as_int(a.pad_h, "pad_h"), as_int(a.pad_w, "pad_w"), as_int(a.stride_h, "stride_h"),
      as_int(a.stride_w, "stride_w"), as_int(a.dilation_h, "dilation_h"),
      as_int(a.dilation_w, "dilation_w"), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DTRAIN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(p->conv, as_int(a.groups, "groups")));
  // f32: FMA only, or DEFAULT_MATH (TF32 permitted) when the job allows it; halves: tensor ops.
  const cudnnMathType_t math = t != DType::f32            ? CUDNN_TENSOR_OP_MATH
                               : a.math == MathMode::tf32 ? CUDNN_DEFAULT_MATH
                                                          : CUDNN_FMA_MATH;
  DTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, math));
  constexpr int kMax = 16;
  int count = 0;
  const std::string what = key_of(a, t, dir, -1);
  // cuDNN's ranked candidates for the direction, then the first that fits (see pick()).
  auto choose = [&](auto* perf, int count, const char* name) {
    const auto* best = pick(perf, count, t, a.math);
    if (best == nullptr) {
      throw Error(fmt::format("conv2d: cuDNN offers no deterministic {} algorithm within {} MiB "
                              "for {}",
                              name, kConvWorkspaceBytes >> 20, what),
                  "use device: cpu for this layer shape, or report the shape");
    }
    p->algo = best->algo, p->workspace = best->memory;
    DTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, best->mathType));
  };
  if (dir == ConvDir::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    DTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, p->x, p->w, p->conv, p->y,
                                                              kMax, &count, perf));
    choose(perf, count, "forward");
  } else if (dir == ConvDir::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    DTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p->w, p->y, p->conv,
                                                                   p->x, kMax, &count, perf));
    choose(perf, count, "backward-data");
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
    DTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p->x, p->y, p->conv,
                                                                     p->w, kMax, &count, perf));
    choose(perf, count, "backward-filter");
  }
  return p;
}

// The cached plan for (args, dtype, direction) on the context's device.
const ConvPlan& plan_for(const Conv2dArgs& a, DType t, ConvDir dir, Context& ctx) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<ConvPlan>> cache;
  const std::string key = key_of(a, t, dir, ctx.device());
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(a, t, dir, ctx.cudnn())).first;
  return *it->second;
}

void check_workspace(const ConvPlan& p, const Workspace& ws, const char* op) {
  DTRAIN_CHECK(ws.bytes >= p.workspace,
               "{}: workspace {} bytes, the chosen cuDNN algorithm needs {} (ask "
               "conv2d_workspace_bytes(args, dtype, device))",
               op, ws.bytes, p.workspace);
}

}  // namespace

void conv2d_forward(const Conv2dArgs& args, const Tensor& x, const Tensor& w, Tensor& y,
                    Workspace ws) {
  Context& ctx = Context::get(x.device().index);
  const ConvPlan& p = plan_for(args, x.dtype(), ConvDir::forward, ctx);
  check_workspace(p, ws, "conv2d_forward");
  const float one = 1.0f, zero = 0.0f;
  DTRAIN_CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn(), &one, p.x, x.raw(), p.w, w.raw(), p.conv,
                                             static_cast<cudnnConvolutionFwdAlgo_t>(p.algo),
                                             ws.data, p.workspace, &zero, p.y, y.raw()));
}

void conv2d_backward_data(const Conv2dArgs& args, const Tensor& dy, const Tensor& w, Tensor& dx,
                          Workspace ws) {
  Context& ctx = Context::get(dy.device().index);
  const ConvPlan& p = plan_for(args, dy.dtype(), ConvDir::backward_data, ctx);
  check_workspace(p, ws, "conv2d_backward_data");
  const float one = 1.0f, zero = 0.0f;
  DTRAIN_CUDNN_CHECK(
      cudnnConvolutionBackwardData(ctx.cudnn(), &one, p.w, w.raw(), p.y, dy.raw(), p.conv,
                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), ws.data,
                                   p.workspace, &zero, p.x, dx.raw()));
}

void conv2d_backward_filter(const Conv2dArgs& args, const Tensor& x, const Tensor& dy, Tensor& dw,
                            Workspace ws) {
  Context& ctx = Context::get(x.device().index);
  const ConvPlan& p = plan_for(args, x.dtype(), ConvDir::backward_filter, ctx);
  check_workspace(p, ws, "conv2d_backward_filter");
  const float one = 1.0f, zero = 0.0f;
  DTRAIN_CUDNN_CHECK(
      cudnnConvolutionBackwardFilter(ctx.cudnn(), &one, p.x, x.raw(), p.y, dy.raw(), p.conv,
                                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), ws.data,
                                     p.workspace, &zero, p.w, dw.raw()));
}

}  // namespace dtrain::kernels::cuda_ops
