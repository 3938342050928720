// The CUDA runtime pieces on a real device (ctest kernels.cuda.runtime, label
// gpu): copies in every direction, pinned stream-ordered copies, the caching
// allocator's statistics and out-of-memory error, an unknown device, and GEMM
// with MathMode::tf32 and with no workspace. Without a usable CUDA device it
// prints "skipped: no GPU (<reason>)" and exits 77 (SKIP_RETURN_CODE).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/device_info.h"
#include "kernels/gemm.h"
#include "kernels/memory.h"

using namespace dtrain;
using namespace dtrain::kernels;

namespace {

const Device kGpu = Device::cuda(0);

Tensor host_iota(int64_t n, float scale) {
  Tensor t = Tensor::empty(Shape{n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = scale * static_cast<float>(i % 97) - 3.0f;
  return t;
}

Tensor on_gpu(const Tensor& host) {
  Tensor t = Tensor::empty(host.shape(), host.dtype(), &device_allocator(kGpu));
  copy(host, t);
  return t;
}

}  // namespace

TEST_CASE("copies host -> device -> device -> host keep every value") {
  const Tensor a = host_iota(10007, 0.25f);
  Tensor d1 = on_gpu(a);
  Tensor d2 = Tensor::empty(a.shape(), DType::f32, &device_allocator(kGpu));
  copy(d1, d2, CopySync::stream_ordered);  // device memory: no host side to pin
  const Tensor back = to_host(d2);
  for (int64_t i = 0; i < a.numel(); ++i) REQUIRE(back.data<float>()[i] == a.data<float>()[i]);
}

TEST_CASE("stream-ordered copies need pinned host memory") {
  Tensor pinned = Tensor::empty(Shape{4096}, DType::f32, &pinned_host_allocator());
  for (int i = 0; i < 4096; ++i) pinned.data<float>()[i] = static_cast<float>(i);
  Tensor dev = Tensor::empty(pinned.shape(), DType::f32, &device_allocator(kGpu));
  copy(pinned, dev, CopySync::stream_ordered);
  Tensor back = Tensor::empty(pinned.shape(), DType::f32, &pinned_host_allocator());
  copy(dev, back, CopySync::stream_ordered);
  synchronize(kGpu);
  CHECK(back.data<float>()[4095] == 4095.0f);

  Tensor pageable = Tensor::empty(pinned.shape(), DType::f32);
  CHECK_THROWS_WITH_AS(copy(pageable, dev, CopySync::stream_ordered),
                       doctest::Contains("needs pinned host memory"), Error);
}

TEST_CASE("the device allocator reports current, peak and reserved bytes") {
  Allocator& alloc = device_allocator(kGpu);
  const MemoryStats before = alloc.stats();
  {
    Tensor t = Tensor::empty(Shape{3 << 20}, DType::u8, &alloc);
    const MemoryStats during = alloc.stats();
    CHECK(during.current >= before.current + (3u << 20));
    CHECK(during.peak >= during.current);
    CHECK(during.reserved >= during.current);
  }
  CHECK(alloc.stats().current == before.current);
}

TEST_CASE("out of device memory is a RunError with the statistics") {
  Allocator& alloc = device_allocator(kGpu);
  Tensor keep = Tensor::empty(Shape{5 << 20}, DType::u8, &alloc);
  CHECK_THROWS_WITH_AS(Tensor::empty(Shape{int64_t{1} << 50}, DType::u8, &alloc),
                       doctest::Contains("out of memory on cuda:0"), RunError);
  try {
    Tensor::empty(Shape{int64_t{1} << 50}, DType::u8, &alloc);
  } catch (const RunError& e) {
    CHECK(std::string(e.message()).find("largest live allocations: 5.00 MiB") != std::string::npos);
  }
  // The failed request left the pool usable.
  Tensor after = Tensor::empty(Shape{1024}, DType::f32, &alloc);
  CHECK(after.device() == kGpu);
}

TEST_CASE("an unknown device index names the device count") {
  CHECK_THROWS_WITH_AS(device_allocator(Device::cuda(999)), doctest::Contains("does not exist"),
                       RunError);
}

TEST_CASE("GEMM: tf32 only when asked, and no workspace still works") {
  GemmArgs g;
  g.m = g.n = g.k = 256;
  const Tensor a = host_iota(g.m * g.k, 0.01f), b = host_iota(g.k * g.n, 0.02f);
  Tensor want = Tensor::empty(Shape{g.m * g.n}, DType::f32);
  std::vector<std::byte> cpu_ws(gemm_workspace_bytes(g, DType::f32, DType::f32) + 64);
  gemm(g, a, b, want, {cpu_ws.data(), cpu_ws.size()});

  Tensor da = on_gpu(a), db = on_gpu(b);
  Tensor dc = Tensor::empty(want.shape(), DType::f32, &device_allocator(kGpu));
  Tensor ws = Tensor::empty(
      Shape{static_cast<int64_t>(gemm_workspace_bytes(g, DType::f32, DType::f32, kGpu))}, DType::u8,
      &device_allocator(kGpu));
  for (MathMode math : {MathMode::fp32, MathMode::tf32}) {
    for (size_t ws_bytes : {ws.nbytes(), size_t{0}}) {
      g.math = math;
      gemm(g, da, db, dc, {ws.raw(), ws_bytes});
      const Tensor got = to_host(dc);
      const double tol = math == MathMode::tf32 ? 2e-2 : 1e-4;
      for (int64_t i = 0; i < got.numel(); i += 97) {
        const double w = want.data<float>()[i];
        REQUIRE(std::abs(got.data<float>()[i] - w) <= tol * (1.0 + std::abs(w)));
      }
    }
  }
}

int main(int argc, char** argv) {
  const CudaInfo info = query_cuda();
  if (!info.available) {
    std::printf("skipped: no GPU (%s)\n", info.reason.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
