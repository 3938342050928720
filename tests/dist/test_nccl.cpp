// The NCCL communicator on one GPU (one rank: the single GPU machine cannot run two
// NCCL ranks, which would share a device). `test_dist_nccl --gpu` (ctest dist.nccl,
// label gpu) exits 77 without a usable GPU; the "failures" suite (ctest
// dist.cuda_failures, every CUDA build) needs none: a failed CUDA or NCCL call is a
// RunError (exit 3), never the Error of bad input (exit 2).
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/allreduce.h"
#include "dist/communicator.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

using namespace dtrain;
using namespace dtrain::dist;

namespace {

Tensor on_gpu(const std::vector<float>& v) {
  Tensor h =
      Tensor::wrap(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, DType::f32);
  Tensor d = Tensor::empty(h.shape(), DType::f32, &kernels::device_allocator(Device::cuda(0)));
  kernels::copy(h, d);
  return d;
}

std::vector<float> from_gpu(const Tensor& d) {
  const Tensor h = kernels::to_host(d);
  return {h.data<float>(), h.data<float>() + h.numel()};
}

}  // namespace

TEST_SUITE("failures") {
  TEST_CASE("a failed CUDA or NCCL call is a RunError naming the call") {
    auto cuda_fails = [] { DTRAIN_CUDA_CHECK(cudaErrorInvalidValue); };
    auto nccl_fails = [] { DTRAIN_NCCL_CHECK(ncclInvalidArgument); };
    CHECK_THROWS_AS(cuda_fails(), RunError);
    CHECK_THROWS_AS(nccl_fails(), RunError);
    try {
      nccl_fails();
    } catch (const RunError& e) {
      CHECK(std::string(e.what()).find("NCCL call ncclInvalidArgument failed") !=
            std::string::npos);
    }
  }
}

TEST_SUITE("gpu") {
  TEST_CASE("one-rank NCCL communicator: every collective, every algorithm, counted") {
    auto self = make_self_communicator();
    auto comm = make_nccl_communicator(*self, Device::cuda(0), std::nullopt);
    CHECK(comm->rank() == 0);
    CHECK(comm->size() == 1);
    CHECK(comm->backend() == "nccl");
    CHECK(comm->device() == Device::cuda(0));
    const Topology topo = comm->topology();
    CHECK(topo.nodes == 1);
    CHECK(topo.ranks_per_node == 1);

    // Ordered after the compute stream: the fill below is only queued when the
    // all-reduce is issued, and the all-reduce must see it.
    Tensor buf = on_gpu(std::vector<float>(1 << 20, 0.0f));
    for (AllreduceAlgo a :
         {AllreduceAlgo::native, AllreduceAlgo::ring, AllreduceAlgo::hierarchical}) {
      CAPTURE(to_string(a));
      kernels::fill(buf, 2.5f);
      Handle h = comm->all_reduce_async(buf, ReduceOp::sum, a);
      h.wait();
      CHECK(h.test());
      const std::vector<float> got = from_gpu(buf);
      CHECK(got.front() == 2.5f);
      CHECK(got.back() == 2.5f);
    }
    Tensor in = on_gpu({1, 2, 3, 4}), out = on_gpu({0, 0, 0, 0});
    kernels::scale(2.0f, in, in);
    comm->reduce_scatter(in, out);
    CHECK(from_gpu(out) == std::vector<float>{2, 4, 6, 8});
    Tensor out2 = on_gpu({0, 0, 0, 0});
    comm->all_gather(in, out2);
    CHECK(from_gpu(out2) == std::vector<float>{2, 4, 6, 8});
    Tensor out3 = on_gpu({0, 0, 0, 0});
    comm->all_to_all_async(in, out3).wait();
    CHECK(from_gpu(out3) == std::vector<float>{2, 4, 6, 8});
    comm->broadcast(out2, 0);
    // ZeRO-3's gather (a group of broadcasts), bf16 included; a count that does not add
    // up to the buffer is a caller's bug.
    Tensor gv = on_gpu({5, 6, 7});
    comm->all_gatherv_async(gv, {3}).wait();
    CHECK(from_gpu(gv) == std::vector<float>{5, 6, 7});
    Tensor half = Tensor::empty(Shape{9}, DType::bf16, &kernels::device_allocator(Device::cuda(0)));
    comm->all_gatherv_async(half, {9}).wait();
    CHECK_THROWS_AS(comm->all_gatherv_async(gv, {2}), InternalError);
    comm->barrier();
    for (DType d : {DType::f16, DType::bf16, DType::f64, DType::i64}) {
      Tensor t = Tensor::empty(Shape{7}, d, &kernels::device_allocator(Device::cuda(0)));
      comm->all_reduce(t, ReduceOp::max);
    }
    const CommStats s = comm->stats();
    CHECK(s.calls == s.completed);
    CHECK(s.calls >= 10);
    CHECK(s.bytes > (size_t{3} << 22));
    CHECK(s.seconds > 0.0);
    CHECK(comm->oldest_pending().seq == 0);
    CHECK(comm->last_op().op == "all_reduce(native,max)");

    auto child = comm->split(0, 0);
    CHECK(child->size() == 1);
    child->all_reduce(buf);
    CHECK(from_gpu(buf).front() == 2.5f);

    // `auto` tunes on the device's buffers.
    const AutoChoice choice = tune_allreduce(*comm, {4096, size_t{1} << 20}, 2);
    CHECK(choice.entries.size() == 2);

    // A host buffer is a caller's bug.
    std::vector<float> host(4);
    Tensor h = Tensor::wrap(host.data(), {4}, DType::f32);
    CHECK_THROWS_AS(comm->all_reduce(h), InternalError);
  }
}

int main(int argc, char** argv) {
  bool gpu = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gpu") == 0) {
      gpu = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  if (gpu) {
    const kernels::CudaInfo info = kernels::query_cuda();
    if (!info.available) {
      std::printf("skipped: no GPU (%s)\n", info.reason.c_str());
      return 77;
    }
    context.setOption("test-suite", "gpu");
  } else {
    context.setOption("test-suite", "failures");
  }
  return context.run();
}
