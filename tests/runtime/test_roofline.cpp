// The roofline step time (runtime/roofline.h) on hand-built graphs against peaks chosen
// so the expected seconds are exact: compute-bound GEMMs, memory-bound element-wise ops,
// micro-batches, checkpointing's recompute, the optimizer pass, and the peak tables.
// Nothing here asserts a measured figure.
#include <doctest/doctest.h>

#include "graph/ops.h"
#include "kernels/peak.h"
#include "runtime/roofline.h"

using namespace dtrain;
using namespace dtrain::graph;
using runtime::roofline_step_time;
using runtime::RooflinePeak;

namespace {

RooflinePeak peak(double matrix_f32, double matrix_half, double vector, double bytes) {
  return {matrix_f32, matrix_half, vector, bytes, "test"};
}

// x [B, C] -> blocks of (linear C -> C, GELU) -> linear C -> K -> loss.
struct Mlp {
  Graph g;
  Mlp(int blocks, DType dtype = DType::f32) {
    g.set_policy({dtype});
    ValueId h = g.input("x", {64, 128}, dtype);
    const ValueId labels = g.input("labels", {64}, DType::i32);
    for (int b = 0; b < blocks; ++b) {
      g.begin_block();
      h = g.add1(fmt::format("block{}.fc", b), linear(128, 128, Bias::yes), {h});
      h = g.add1(fmt::format("block{}.act", b), activation(kernels::Activation::gelu_tanh), {h});
      g.end_block();
    }
    h = g.add1("head", linear(128, 10, Bias::no), {h});
    g.add1("loss", softmax_cross_entropy(), {h, labels});
  }
};

}  // namespace

TEST_CASE("a GEMM the compute bounds takes its FLOPs at the matrix peak, three passes") {
  Graph g;
  const ValueId x = g.input("x", {256, 512}, DType::f32);
  g.add1("fc", linear(512, 1024, Bias::no), {x});
  const double flops = 2.0 * 256 * 512 * 1024;
  const double bytes = 4.0 * (256 * 512 + 256 * 1024 + 1024 * 512);
  const auto e = roofline_step_time(g, peak(1e9, 1e12, 1e12, 1e18), 1);
  CHECK(e.seconds == doctest::Approx(3 * flops / 1e9));
  CHECK(e.compute_bound_seconds == doctest::Approx(e.seconds));
  CHECK(e.memory_bound_seconds == 0.0);
  CHECK(e.flops == doctest::Approx(3 * flops));
  CHECK(e.bytes == doctest::Approx(3 * bytes));
  CHECK(e.source == "test");
}

TEST_CASE("an element-wise op is memory-bound: its input and output bytes at the bandwidth") {
  Graph g;
  const ValueId x = g.input("x", {1 << 20}, DType::f32);
  g.add1("relu", activation(kernels::Activation::relu), {x});
  const double bytes = 2.0 * 4 * (1 << 20);
  const auto e = roofline_step_time(g, peak(1e15, 1e15, 1e15, 1e9), 1);
  CHECK(e.seconds == doctest::Approx(3 * bytes / 1e9));
  CHECK(e.memory_bound_seconds == doctest::Approx(e.seconds));
  CHECK(e.compute_bound_seconds == 0.0);
}

TEST_CASE("half matrix ops run at the half peak, the others at the vector peak") {
  Graph g;
  g.set_policy({DType::bf16});
  const ValueId x = g.input("x", {256, 512}, DType::bf16);
  g.add1("fc", linear(512, 1024, Bias::no), {x});
  const double flops = 2.0 * 256 * 512 * 1024;
  const auto e = roofline_step_time(g, peak(1e9, 4e9, 1e12, 1e18), 1);
  CHECK(e.seconds == doctest::Approx(3 * flops / 4e9));
  // The same GEMM in f32 takes the f32 matrix peak (a quarter of the speed here).
  Graph f;
  f.add1("fc", linear(512, 1024, Bias::no), {f.input("x", {256, 512}, DType::f32)});
  CHECK(roofline_step_time(f, peak(1e9, 4e9, 1e12, 1e18), 1).seconds ==
        doctest::Approx(4 * e.seconds));
}

TEST_CASE("micro-batches multiply the graph's time, not the optimizer's") {
  Mlp m(2);
  const RooflinePeak p = peak(2e9, 8e9, 1e9, 5e8);
  const size_t opt = 12'000'000;
  const auto one = roofline_step_time(m.g, p, 1, 0, opt);
  const auto two = roofline_step_time(m.g, p, 2, 0, opt);
  CHECK(one.optimizer_seconds == doctest::Approx(opt / 5e8));
  CHECK(two.optimizer_seconds == doctest::Approx(one.optimizer_seconds));
  CHECK(two.seconds - two.optimizer_seconds ==
        doctest::Approx(2 * (one.seconds - one.optimizer_seconds)));
  const auto none = roofline_step_time(m.g, p, 1);
  CHECK(none.seconds == doctest::Approx(one.seconds - opt / 5e8));
  CHECK(one.compute_bound_seconds + one.memory_bound_seconds == doctest::Approx(one.seconds));
}

TEST_CASE("checkpointing adds one forward of the blocks' nodes, not of the head") {
  Mlp m(3);
  const RooflinePeak p = peak(2e9, 8e9, 1e9, 5e8);
  const auto none = roofline_step_time(m.g, p, 1, 0);
  const auto block = roofline_step_time(m.g, p, 1, 1);
  const auto every3 = roofline_step_time(m.g, p, 1, 3);
  CHECK(none.recompute_seconds == 0.0);
  CHECK(block.recompute_seconds > 0.0);
  CHECK(block.seconds == doctest::Approx(none.seconds + block.recompute_seconds));
  // Every block is recomputed whatever the segment length.
  CHECK(every3.seconds == doctest::Approx(block.seconds));
  // The blocks' forward: one pass of each block node, without the head and the loss.
  Mlp head_only(0);
  const double head = roofline_step_time(head_only.g, p, 1).seconds / 3;
  CHECK(block.recompute_seconds == doctest::Approx(none.seconds / 3 - head));
  // Twice the micro-batches, twice the recompute.
  CHECK(roofline_step_time(m.g, p, 2, 1).recompute_seconds ==
        doctest::Approx(2 * block.recompute_seconds));
}

TEST_CASE("GPU peaks come from the datasheets, named as such") {
  bool matched = false;
  const auto a100 = kernels::gpu_datasheet("NVIDIA A100-SXM4-80GB", &matched);
  CHECK(matched);
  CHECK(a100.half_tensor_flops == 312e12);
  CHECK(kernels::gpu_datasheet("NVIDIA H100 80GB HBM3", &matched).bytes_per_s == 3.35e12);
  CHECK(matched);
  const auto other = kernels::gpu_datasheet("Tesla V100-SXM2-16GB", &matched);
  CHECK_FALSE(matched);
  CHECK(other.name.find("H200") != std::string::npos);
  CHECK(kernels::gpu_datasheet("", &matched).bytes_per_s == 4.8e12);

  // With or without a GPU here, `--device cuda` gets a datasheet's figures.
  const RooflinePeak fp32 = runtime::roofline_peak(Device::cuda(), DType::bf16);
  const RooflinePeak tf32 =
      runtime::roofline_peak(Device::cuda(), DType::bf16, kernels::MathMode::tf32);
  CHECK(fp32.source.find("datasheet") != std::string::npos);
  CHECK(tf32.matrix_f32_flops > fp32.matrix_f32_flops);
  CHECK(fp32.matrix_half_flops > tf32.matrix_f32_flops);
  CHECK(fp32.vector_flops == fp32.matrix_f32_flops);
}

TEST_CASE("the host's peak is measured, and f16 GEMMs take the fp32 peak") {
  const RooflinePeak bf16 = runtime::roofline_peak(Device::cpu(), DType::bf16);
  CHECK(bf16.matrix_f32_flops > 0);
  CHECK(bf16.matrix_half_flops > 0);
  CHECK(bf16.bytes_per_s > 0);
  CHECK(bf16.source.find("measured") != std::string::npos);
  const RooflinePeak f16 = runtime::roofline_peak(Device::cpu(), DType::f16);
  CHECK(f16.matrix_half_flops == f16.matrix_f32_flops);  // widened to f32 (dense_dnnl.h)
  CHECK(f16.bytes_per_s == bf16.bytes_per_s);            // measured once per process
}

TEST_CASE("a job's optimizer bytes follow its optimizer, precision and accumulation") {
  Mlp m(2);
  const double n = static_cast<double>(m.g.num_params());
  Job job;  // AdamW, fp32: gradient 2 words, weights 2, exp_avg and exp_avg_sq 2 each
  CHECK(runtime::optimizer_step_bytes(job, m.g) == static_cast<size_t>(8 * 4 * n));
  job.optimizer.name = OptimizerName::sgd;
  job.optimizer.momentum = 0;
  CHECK(runtime::optimizer_step_bytes(job, m.g) == static_cast<size_t>(4 * 4 * n));
  job.optimizer.clip_grad_norm = 1.0;
  job.parallel.micro_batches = 2;
  CHECK(runtime::optimizer_step_bytes(job, m.g) == static_cast<size_t>((4 + 1 + 6) * 4 * n));
  Job half;
  half.precision.dtype = PrecisionDType::bf16;  // fp32 masters, the bf16 copy written back
  CHECK(runtime::optimizer_step_bytes(half, m.g) == static_cast<size_t>(8.5 * 4 * n));
}

TEST_CASE("a job's step time is the roofline of its peak, checkpointing and optimizer") {
  Mlp m(3);
  Job job;
  job.device = Device::cuda();
  job.memory.checkpointing = ActivationCheckpointing::block;
  job.parallel.micro_batches = 2;
  const auto e = runtime::estimate_step_time(job, m.g);
  const auto expect = roofline_step_time(m.g, runtime::roofline_peak(job.device, DType::f32), 2, 1,
                                         runtime::optimizer_step_bytes(job, m.g));
  CHECK(e.seconds == doctest::Approx(expect.seconds));
  CHECK(e.recompute_seconds > 0);
  CHECK(e.optimizer_seconds > 0);
  CHECK(e.source.find("datasheet") != std::string::npos);
}

TEST_CASE(
    "offloaded, the optimizer's step takes the host's bandwidth and its transfers the link's") {
  Mlp m(2);
  RooflinePeak p = peak(2e9, 8e9, 1e9, 5e8);
  p.host_bytes_per_s = 1e8;
  p.link_bytes_per_s = 2e7;
  const size_t device = 4'000'000, host = 30'000'000, link = 6'000'000;
  const auto plain = roofline_step_time(m.g, p, 1, 0, device);
  const auto off = roofline_step_time(m.g, p, 1, 0, device, host, link);
  CHECK(off.optimizer_seconds == doctest::Approx(device / 5e8 + host / 1e8));
  CHECK(off.offload_seconds == doctest::Approx(link / 2e7));
  CHECK(off.seconds == doctest::Approx(plain.seconds + host / 1e8 + link / 2e7));
  CHECK(off.compute_bound_seconds + off.memory_bound_seconds + off.offload_seconds ==
        doctest::Approx(off.seconds));
  CHECK(off.bytes == doctest::Approx(plain.bytes + host));  // the link's are not the kernels'
  CHECK(plain.offload_seconds == 0.0);
}

TEST_CASE("a job's optimizer traffic: offload moves the step to the host, ZeRO-1 shards it") {
  Mlp m(2);
  const double n = static_cast<double>(m.g.num_params());
  Job job;
  job.device = Device::cuda();
  job.precision.dtype = PrecisionDType::bf16;
  job.parallel.micro_batches = 2;
  const size_t all = runtime::optimizer_step_bytes(job, m.g);
  const auto plain = runtime::optimizer_traffic(job, m.g);
  CHECK(plain.device_bytes == all);
  CHECK(plain.host_bytes == 0);
  CHECK(plain.link_bytes == 0);
  job.memory.offload.optimizer = true;
  const auto off = runtime::optimizer_traffic(job, m.g);
  // The device zeroes the gradient and accumulates (1 + 3 x 2 words); the host reads the
  // gradient, steps the masters, writes the half twin and both AdamW states.
  CHECK(off.device_bytes == static_cast<size_t>(7 * 4 * n));
  CHECK(off.host_bytes == static_cast<size_t>(7.5 * 4 * n));
  CHECK(off.device_bytes + off.host_bytes == all);
  double params = 0;
  for (const auto& e : m.g.param_layout())
    params += static_cast<double>(e.spec.shape.numel()) * dtype_size(e.spec.dtype);
  CHECK(off.link_bytes == static_cast<size_t>(4 * n + params));  // f32 down, weights up
  // Offload is a CUDA key: a CPU job's step stays where it is.
  job.device = Device::cpu();
  CHECK(runtime::optimizer_traffic(job, m.g).host_bytes == 0);

  Job zero;  // fp32 AdamW on 4 ranks: the step's 7 words on about a quarter
  zero.parallel.data = 4;
  zero.parallel.zero_stage = 1;
  const double share = static_cast<double>(runtime::optimizer_step_bytes(zero, m.g)) / (4 * n);
  CHECK(share > 1 + 7.0 / 4 - 0.01);
  CHECK(share < 1 + 7.0 / 4 + 0.01);
}

TEST_CASE("the offload peak: the datasheet's PCIe figure per direction, the host's bandwidth") {
  CHECK(kernels::gpu_datasheet("NVIDIA H200").host_link_bytes_per_s == 64e9);
  CHECK(kernels::gpu_datasheet("NVIDIA A100-SXM4-80GB").host_link_bytes_per_s == 32e9);
  const RooflinePeak plain = runtime::roofline_peak(Device::cuda(), DType::bf16);
  CHECK(plain.host_bytes_per_s == 0);
  CHECK(plain.link_bytes_per_s == 0);
  const RooflinePeak off =
      runtime::roofline_peak(Device::cuda(), DType::bf16, kernels::MathMode::fp32, true);
  CHECK(off.host_bytes_per_s > 0);
  CHECK(off.link_bytes_per_s > 0);
  CHECK(off.source.find("PCIe") != std::string::npos);
  CHECK(off.source.find("measured on this host") != std::string::npos);

  Mlp m(2, DType::bf16);
  Job job;
  job.device = Device::cuda();
  job.precision.dtype = PrecisionDType::bf16;
  const auto without = runtime::estimate_step_time(job, m.g);
  job.memory.offload.optimizer = true;
  const auto with = runtime::estimate_step_time(job, m.g);
  CHECK(without.offload_seconds == 0);
  CHECK(with.offload_seconds > 0);
  CHECK(with.optimizer_seconds > without.optimizer_seconds);  // a host's bandwidth, not HBM's
  CHECK(with.seconds > without.seconds);
}
