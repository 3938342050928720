// The optimizers with their state on a CUDA device (ctest optim.cuda, label gpu):
// SGD (momentum, Nesterov), AdamW and LAMB on the padded multi-segment layout of
// util.h, stepped on the GPU, against the fp64 references of reference.h; padding
// untouched; the state round trip through the host; and global-norm clipping on the
// device. Without a usable CUDA device it prints "skipped: no GPU (<reason>)" and
// exits 77 (SKIP_RETURN_CODE).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "reference.h"
#include "util.h"

using namespace dtrain;
using namespace dtrain::optim;
using namespace dtrain::optim::test;

namespace {

const Device kGpu = Device::cuda(0);

Tensor to_gpu(const std::vector<float>& v) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(v.size())}, DType::f32,
                           &kernels::device_allocator(kGpu));
  kernels::copy(as_tensor(const_cast<std::vector<float>&>(v)), t);
  return t;
}

std::vector<float> to_vector(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  Tensor h = as_tensor(v);
  kernels::copy(t, h);
  return v;
}

using RefStep = void (*)(RefState&, const std::vector<float>&, const std::vector<ParamSegment>&,
                         const OptimizerOptions&, double);

// As test_optimizers.cpp's max_rel_error, with params, grads and state on the GPU.
double max_rel_error_gpu(const OptimizerOptions& o, RefStep ref, int steps) {
  const auto segs = layout();
  const std::vector<float> p0 = pattern(kTotal, 1);
  RefState r = ref_init(p0);
  auto opt = make_optimizer(o, segs, kTotal, kGpu);
  Tensor pt = to_gpu(p0);
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> g = pattern(kTotal, 100 + s);
    const double lr = 0.05 * (1.0 + 0.1 * s);
    opt->step(pt, to_gpu(g), lr);
    ref(r, g, segs, o, lr);
  }
  const std::vector<float> p = to_vector(pt);
  double worst = 0;
  for (const auto& seg : segs)
    for (int64_t i = seg.offset; i < seg.offset + seg.size; ++i)
      worst = std::max(worst, std::abs(p[i] - r.p[i]) / (1.0 + std::abs(r.p[i])));
  CHECK(p[310] == p0[310]);  // padding between w and b
  CHECK(p[9399] == p0[9399]);
  return worst;
}

}  // namespace

TEST_CASE("sgd, adamw and lamb on CUDA match the fp64 reference") {
  OptimizerOptions o = options_for(OptimizerName::sgd);
  o.momentum = 0.9;
  CHECK(max_rel_error_gpu(o, ref_sgd, 5) < 1e-6);
  o.nesterov = true;
  CHECK(max_rel_error_gpu(o, ref_sgd, 5) < 1e-6);
  CHECK(max_rel_error_gpu(options_for(OptimizerName::adamw), ref_adamw, 6) < 1e-6);
  CHECK(max_rel_error_gpu(options_for(OptimizerName::lamb), ref_lamb, 6) < 1e-6);
}

// optimizer.ema on the device: the same average as the CPU's (the same f32 expression;
// nvcc may fuse its multiply-add, so within a few units in the last place).
TEST_CASE("optimizer.ema on CUDA keeps the CPU's average") {
  OptimizerOptions o = options_for(OptimizerName::adamw);
  o.ema.decay = 0.9;
  auto gpu = make_optimizer(o, layout(), kTotal, kGpu);
  auto cpu = make_optimizer(o, layout(), kTotal);
  std::vector<float> pc = pattern(kTotal, 1);
  Tensor pg = to_gpu(pc), pct = as_tensor(pc);
  for (int s = 0; s < 4; ++s) {
    std::vector<float> g = pattern(kTotal, 100 + s);
    gpu->step(pg, to_gpu(g), 0.01);
    cpu->step(pct, as_tensor(g), 0.01);
  }
  const std::vector<float> eg = to_vector(gpu->ema());
  const float* ec = cpu->ema().data<float>();
  double worst = 0;
  for (int64_t i = 0; i < kTotal; ++i)
    worst = std::max(worst, std::abs(eg[i] - ec[i]) / (1.0 + std::abs(ec[i])));
  CHECK(worst < 1e-6);
  CHECK(eg[310] == 0.0f);  // padding
}

TEST_CASE("CUDA optimizer state round-trips through the host") {
  const auto segs = layout();
  auto a = make_optimizer(options_for(OptimizerName::adamw), segs, kTotal, kGpu);
  Tensor p = to_gpu(pattern(kTotal, 1));
  a->step(p, to_gpu(pattern(kTotal, 2)), 0.01);
  OptimizerState saved = a->state();
  for (auto& [name, t] : saved.buffers) {  // as a checkpoint holds it: on the host
    Tensor h = Tensor::empty(t.shape(), t.dtype());
    kernels::copy(t, h);
    t = h;
  }
  auto b = make_optimizer(options_for(OptimizerName::adamw), segs, kTotal, kGpu);
  b->load_state(saved);
  Tensor pa = to_gpu(pattern(kTotal, 3)), pb = to_gpu(pattern(kTotal, 3));
  a->step(pa, to_gpu(pattern(kTotal, 4)), 0.01);
  b->step(pb, to_gpu(pattern(kTotal, 4)), 0.01);
  CHECK(to_vector(pa) == to_vector(pb));
}

TEST_CASE("global-norm clipping on CUDA scales to max_norm") {
  const std::vector<float> g = pattern(kTotal, 5);
  double want = 0;
  for (float x : g) want += static_cast<double>(x) * x;
  Tensor gt = to_gpu(g);
  CHECK(std::abs(grad_sum_squares(gt) - want) <= 1e-5 * want);
  const double norm = clip_grad_norm(gt, 0.5);
  CHECK(std::abs(norm - std::sqrt(want)) <= 1e-5 * std::sqrt(want));
  const std::vector<float> clipped = to_vector(gt);
  double after = 0;
  for (float x : clipped) after += static_cast<double>(x) * x;
  CHECK(std::abs(std::sqrt(after) - 0.5) < 1e-4);
}

// The mixed-precision step on the GPU: grad_scale folded in, bf16 copies written in the
// same kernel (the rounded masters, bit for bit), and bf16 parameters stepped in place
// (within one bf16 unit of the CPU's: nvcc may fuse a multiply-add the CPU rounds).
TEST_CASE("the fused mixed-precision step on CUDA: grad_scale, copies and in-place bf16") {
  const auto segs = layout();
  for (OptimizerName name : {OptimizerName::sgd, OptimizerName::adamw}) {
    CAPTURE(to_string(name));
    const OptimizerOptions o = options_for(name);
    auto with = make_optimizer(o, segs, kTotal, kGpu);
    auto views_opt = make_optimizer(o, segs, kTotal, kGpu);
    auto cpu_views = make_optimizer(o, segs, kTotal);
    Tensor p = to_gpu(pattern(kTotal, 1));
    std::vector<Tensor> copies, views, host_views;
    for (const ParamSegment& s : segs) {
      Tensor c = Tensor::empty(Shape{s.size}, DType::bf16, &kernels::device_allocator(kGpu));
      kernels::cast(p.view(s.offset, Shape{s.size}), c);
      copies.push_back(c);
      Tensor v = Tensor::empty(Shape{s.size}, DType::bf16, &kernels::device_allocator(kGpu));
      kernels::copy(c, v);
      views.push_back(v);
      Tensor h = Tensor::empty(Shape{s.size}, DType::bf16);
      kernels::copy(c, h);
      host_views.push_back(h);
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = pattern(kTotal, 100 + step);
      with->step(ParamTarget{p, copies, {}}, to_gpu(g), 0.05, 0.25f);
      views_opt->step(ParamTarget{{}, {}, views}, to_gpu(g), 0.05, 0.25f);
      cpu_views->step(ParamTarget{{}, {}, host_views}, as_tensor(g), 0.05, 0.25f);
    }
    for (size_t s = 0; s < segs.size(); ++s) {
      Tensor want = Tensor::empty(Shape{segs[s].size}, DType::bf16);
      Tensor masters = Tensor::empty(Shape{segs[s].size}, DType::f32);
      kernels::copy(p.view(segs[s].offset, Shape{segs[s].size}), masters);
      kernels::cast(masters, want);
      Tensor got = Tensor::empty(Shape{segs[s].size}, DType::bf16);
      kernels::copy(copies[s], got);
      CHECK(std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0);
      Tensor in_place = Tensor::empty(Shape{segs[s].size}, DType::bf16);
      kernels::copy(views[s], in_place);
      Tensor a = Tensor::empty(Shape{segs[s].size}, DType::f32);
      Tensor b = Tensor::empty(Shape{segs[s].size}, DType::f32);
      kernels::cast(in_place, a);
      kernels::cast(host_views[s], b);
      for (int64_t i = 0; i < segs[s].size; ++i) {
        const float x = a.data<float>()[i], y = b.data<float>()[i];
        CHECK(std::abs(x - y) <= std::abs(y) * 0.0079f + 1e-30f);  // one bf16 unit: 2^-7
      }
    }
  }
}

int main(int argc, char** argv) {
  const kernels::CudaInfo info = kernels::query_cuda();
  if (!info.available) {
    std::printf("skipped: no GPU (%s)\n", info.reason.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
