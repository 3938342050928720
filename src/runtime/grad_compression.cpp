// See grad_compression.h.
#include "runtime/grad_compression.h"

#include <fmt/format.h>

#include "dist/ddp.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::runtime {

std::vector<compress::ParamInfo> compression_params(const std::vector<graph::FlatEntry>& layout) {
  std::vector<compress::ParamInfo> params;
  for (const graph::FlatEntry& e : layout) {
    const Shape& sh = e.spec.shape;
    params.push_back({e.offset, sh.numel(), sh.rank() >= 2 ? sh[0] : 0});
  }
  return params;
}

CompressionPlanSummary summarize_plan(const CompressOptions& o,
                                      const std::vector<compress::BucketPlan>& plans, int tensors) {
  CompressionPlanSummary s;
  for (const compress::BucketPlan& p : plans) s.compressed += static_cast<int>(p.compressed.size());
  s.tensors = tensors;
  s.per_step = compress::bytes_per_step(o, plans);
  return s;
}

GradCompression::GradCompression(const CompressOptions& o,
                                 const std::vector<graph::FlatEntry>& layout,
                                 const std::vector<dist::Bucket>& buckets,
                                 dist::Communicator& grad_comm, dist::GradSync& sync,
                                 int64_t layout_elems, AllreduceAlgo dense_algo, uint64_t seed,
                                 Device device)
    : o_(o),
      sync_(sync),
      compressor_(o, grad_comm, compress::plan_compression(o, buckets, compression_params(layout)),
                  layout_elems, dense_algo, seed, device),
      summary_(summarize_plan(o, compressor_.plans(), static_cast<int>(layout.size()))) {
  sync_.set_reducer([this](size_t b, Tensor grads) { compressor_.reduce(b, grads); });
}

std::string GradCompression::describe() const {
  return fmt::format(
      "compression: {} on {} of {} parameter tensors, error feedback {}, {} dense step(s) "
      "first; {} bytes sent per step per rank instead of {} ({:.1f}x)",
      to_string(o_.method), summary_.compressed, summary_.tensors, o_.error_feedback ? "on" : "off",
      o_.warmup_steps, summary_.per_step.sent, summary_.per_step.dense, summary_.ratio());
}

void GradCompression::begin_step(int64_t step) { sync_.use_reducer(step >= o_.warmup_steps); }

std::vector<NamedTensor> GradCompression::state(dist::Communicator& comm, bool sharded) const {
  const Tensor mine = kernels::to_host(compressor_.residual());  // a copy only on a device
  const int64_t n = mine.numel();
  std::vector<NamedTensor> out;
  if (sharded) {
    Tensor copy = Tensor::empty(Shape{n}, DType::f32);
    kernels::copy(mine, copy);
    out.push_back({"compress.residual", copy});
  } else if (comm.rank() == 0) {
    Tensor all = Tensor::empty(Shape{comm.size(), n}, DType::f32);
    Tensor row0 = all.view(0, Shape{n});
    kernels::copy(mine, row0);
    for (int r = 1; r < comm.size(); ++r) {
      Tensor row = all.view(r * n, Shape{n});
      comm.recv(row, r);
    }
    out.push_back({"compress.residual", all});
  } else {
    comm.send(mine, 0);
    return {};
  }
  const Tensor q = compressor_.powersgd_q();
  if (comm.rank() == 0 && q.defined()) {
    Tensor copy = Tensor::empty(q.shape(), DType::f32);
    kernels::copy(q, copy);
    out.push_back({"compress.q", copy});
  }
  return out;
}

bool GradCompression::restore(const std::vector<NamedTensor>& blobs, int rank, int world) {
  Tensor residual = compressor_.residual();
  Tensor q = compressor_.powersgd_q();
  const int64_t n = residual.numel();
  bool got_residual = false, got_q = !q.defined();
  for (const NamedTensor& t : blobs) {
    if (t.name == "compress.residual" && t.tensor.dtype() == DType::f32) {
      Tensor row;
      if (t.tensor.shape().rank() == 2 && t.tensor.shape()[0] == world &&
          t.tensor.shape()[1] == n) {
        row = t.tensor.view(rank * n, Shape{n});
      } else if (t.tensor.shape().rank() == 1 && t.tensor.numel() == n) {
        row = t.tensor;
      }
      if (row.defined()) {
        kernels::copy(row, residual);
        got_residual = true;
      }
    }
    if (q.defined() && t.name == "compress.q" && t.tensor.dtype() == DType::f32 &&
        t.tensor.numel() == q.numel()) {
      kernels::copy(t.tensor.view(0, q.shape()), q);
      got_q = true;
    }
  }
  return got_residual && got_q;
}

void GradCompression::adjust(const precision::ScaleDecision& d) {
  Tensor r = compressor_.residual();
  if (d.skip) {
    kernels::fill(r, -0.0f);  // -0: see Compressor's constructor
  } else if (d.new_scale != d.old_scale) {
    kernels::scale(static_cast<float>(d.new_scale / d.old_scale), r, r);
  }
}

}  // namespace dtrain::runtime
