// See master_weights.h.
#include "runtime/master_weights.h"

#include "kernels/elementwise.h"
#include "kernels/memory.h"

namespace dtrain::runtime {
namespace {

std::vector<graph::FlatEntry> f32_layout(const graph::FlatStore& params) {
  std::vector<graph::FlatEntry> entries = params.entries();
  for (graph::FlatEntry& e : entries) e.spec.dtype = DType::f32;
  return entries;
}

}  // namespace

MasterWeights::MasterWeights(graph::Executor& ex, MasterMode mode, uint64_t seed, Device device)
    : ex_(ex), mode_(mode), layout_(f32_layout(ex.params())) {
  for (size_t p = 0; p < layout_.entries().size(); ++p) {
    DTRAIN_CHECK(layout_.entries()[p].offset == ex.grads().entries()[p].offset &&
                     ex.grads().entries()[p].spec.dtype == DType::f32,
                 "the executor's gradient {} is not in the fp32 layout", layout_.entries()[p].name);
  }
  grads_ = ex.grads().flat(DType::f32);
  if (mode_ == MasterMode::fp32) {
    for (const graph::FlatEntry& e : ex.params().entries()) {
      DTRAIN_CHECK(e.spec.dtype == DType::f32, "{} is {} in an fp32 run", e.name,
                   dtype_name(e.spec.dtype));
    }
    target_.flat = ex.params().flat(DType::f32);
    return;
  }
  std::vector<Tensor> views;
  for (int p = 0; p < ex.params().size(); ++p) views.push_back(ex.params().view(p));
  if (mode_ == MasterMode::masters) {
    layout_.allocate(device);
    layout_.initialize(seed);
    publish(layout_);
    target_.flat = layout_.flat(DType::f32);
    target_.copies = std::move(views);
  } else {
    target_.views = std::move(views);
  }
}

void MasterWeights::publish(const graph::FlatStore& from) {
  for (int p = 0; p < from.size(); ++p) {
    Tensor dst = ex_.params().view(p);
    kernels::cast(from.view(p), dst);
  }
}

graph::FlatStore& MasterWeights::state() {
  if (mode_ == MasterMode::fp32) return ex_.params();
  if (mode_ == MasterMode::masters) return layout_;
  wide_ = std::make_unique<graph::FlatStore>(layout_.entries());
  wide_->allocate(ex_.params().device());
  for (int p = 0; p < wide_->size(); ++p) {
    Tensor dst = wide_->view(p);
    kernels::cast(ex_.params().view(p), dst);
  }
  return *wide_;
}

void MasterWeights::state_loaded() {
  if (mode_ == MasterMode::masters) publish(layout_);
  if (mode_ == MasterMode::in_place && wide_) publish(*wide_);
}

}  // namespace dtrain::runtime
