// The compressor with gradients, residual and PowerSGD's Q on a CUDA device (ctest
// compress.cuda, label gpu), against the same compressor on the CPU, on one rank (the
// self communicator: what a rank sends is what comes back), five steps of each method
// (top-k and 1-bit gathered and two-phase):
// top-k selects the same entries, so its sums and residual are the CPU's bits; 1-bit's
// chunk means are summed in another order (within 1e-6); PowerSGD's products are
// cuBLAS's instead of oneDNN's (within 1e-4 of the gradient scale). Pipelined (two
// buckets in flight) gives the bits of one bucket at a time on the device. Without a usable
// CUDA device it prints "skipped: no GPU (<reason>)" and exits 77.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "compress/compressor.h"
#include "core/rng.h"
#include "kernels/device_info.h"
#include "kernels/memory.h"

using namespace dtrain;
using namespace dtrain::compress;

namespace {

const Device kGpu = Device::cuda(0);

// Two matrices (16 x 96, 40 x 32) and a bias (24), as tests/compress/test_compressor.cpp.
const std::vector<ParamInfo> kParams = {{0, 16 * 96, 16}, {1536, 40 * 32, 40}, {2816, 24, 0}};
constexpr int64_t kTotal = 2816 + 32;

std::vector<float> gradient(uint64_t step) {
  const Philox rng(11, step);
  std::vector<float> g(static_cast<size_t>(kTotal));
  for (int64_t i = 0; i < kTotal; ++i)
    g[static_cast<size_t>(i)] = rng.normal(static_cast<uint64_t>(i));
  return g;
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  Tensor h = Tensor::wrap(v.data(), t.shape(), DType::f32);
  kernels::copy(t, h);
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

}  // namespace

TEST_CASE("each method on the GPU gives the CPU's result") {
  auto self = dist::make_self_communicator();
  const std::vector<dist::Bucket> buckets = {{0, kTotal, {2, 1, 0}, {}}};
  struct Case {
    CompressMethod m;
    CompressExchange exchange;
  };
  for (const Case c : {Case{CompressMethod::topk, CompressExchange::gather},
                       Case{CompressMethod::topk, CompressExchange::two_phase},
                       Case{CompressMethod::onebit, CompressExchange::gather},
                       Case{CompressMethod::onebit, CompressExchange::two_phase},
                       Case{CompressMethod::powersgd, CompressExchange::auto_}}) {
    const CompressMethod m = c.m;
    CAPTURE(std::string(to_string(m)));
    CAPTURE(std::string(to_string(c.exchange)));
    CompressOptions o;
    o.method = m;
    o.ratio = 0.05;
    o.rank = 2;
    o.exchange = c.exchange;
    const std::vector<BucketPlan> plan = plan_compression(o, buckets, kParams, 1024);
    Compressor cpu(o, *self, plan, kTotal, AllreduceAlgo::ring, 5);
    Compressor gpu(o, *self, plan, kTotal, AllreduceAlgo::ring, 5, kGpu);
    CHECK(gpu.residual().device() == kGpu);
    const double tol = m == CompressMethod::topk ? 0.0 : m == CompressMethod::onebit ? 1e-6 : 1e-4;
    for (uint64_t step = 0; step < 5; ++step) {
      std::vector<float> g = gradient(step);
      Tensor on_gpu = Tensor::empty(Shape{kTotal}, DType::f32, &kernels::device_allocator(kGpu));
      kernels::copy(Tensor::wrap(g.data(), Shape{kTotal}, DType::f32), on_gpu);
      cpu.reduce(0, Tensor::wrap(g.data(), Shape{kTotal}, DType::f32));
      gpu.reduce(0, on_gpu);
      const std::vector<float> from_gpu = host(on_gpu);
      if (m == CompressMethod::topk) {
        CHECK(std::memcmp(from_gpu.data(), g.data(), g.size() * 4) == 0);
        const std::vector<float> rc = host(cpu.residual()), rg = host(gpu.residual());
        CHECK(std::memcmp(rc.data(), rg.data(), rc.size() * 4) == 0);
      } else {
        CHECK(max_diff(from_gpu, g) <= tol * 4);
        CHECK(max_diff(host(cpu.residual()), host(gpu.residual())) <= tol * 4);
      }
      // Two-phase on one rank: the one segment is the bucket, and its server residual
      // (what the second compression left) the same on both.
      CHECK(gpu.server_residual().numel() == cpu.server_residual().numel());
      if (cpu.server_residual().numel() > 0)
        CHECK(max_diff(host(cpu.server_residual()), host(gpu.server_residual())) <= tol * 4);
    }
    if (m == CompressMethod::powersgd)
      CHECK(max_diff(host(cpu.powersgd_q()), host(gpu.powersgd_q())) < 1e-3);
  }
}

// Pipelined on the device (advance() before each start(), two buckets in flight, one in
// its second collective): the same bits as one bucket at a time on the device.
TEST_CASE("pipelined exchanges on the GPU give the bits of one bucket at a time") {
  auto self = dist::make_self_communicator();
  const std::vector<dist::Bucket> three = {
      {1536, 2816, {1}, {}}, {0, 1536, {0}, {}}, {2816, kTotal, {2}, {}}};
  for (const CompressMethod m :
       {CompressMethod::topk, CompressMethod::onebit, CompressMethod::powersgd}) {
    CAPTURE(std::string(to_string(m)));
    CompressOptions o;
    o.method = m;
    o.ratio = 0.05;
    o.rank = 2;
    o.exchange =
        m == CompressMethod::powersgd ? CompressExchange::auto_ : CompressExchange::two_phase;
    const std::vector<BucketPlan> plan = plan_compression(o, three, kParams, 1024);
    Compressor piped(o, *self, plan, kTotal, AllreduceAlgo::ring, 5, kGpu);
    Compressor alone(o, *self, plan, kTotal, AllreduceAlgo::ring, 5, kGpu);
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<float> g = gradient(step);
      const auto upload = [&] {
        Tensor t = Tensor::empty(Shape{kTotal}, DType::f32, &kernels::device_allocator(kGpu));
        kernels::copy(Tensor::wrap(g.data(), Shape{kTotal}, DType::f32), t);
        return t;
      };
      Tensor a = upload(), b = upload();
      for (size_t k = 0; k < three.size(); ++k) {
        piped.advance();
        piped.start(k, a);
      }
      CHECK(piped.complete().size() == 2);  // buckets 1 (the first matrix) and 2 (the bias)
      for (size_t k = 0; k < three.size(); ++k) alone.reduce(k, b);
      const std::vector<float> ha = host(a), hb = host(b);
      CHECK(std::memcmp(ha.data(), hb.data(), ha.size() * 4) == 0);
    }
    const std::vector<float> ra = host(piped.residual()), rb = host(alone.residual());
    CHECK(std::memcmp(ra.data(), rb.data(), ra.size() * 4) == 0);
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
