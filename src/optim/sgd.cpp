// SGD with momentum (dampening 0), Nesterov and L2 weight decay, PyTorch semantics:
//   d = g + wd * p                        (wd = 0 on no_decay segments)
//   b = mu * b + d                        (state "momentum", zeroed, so b = d on step 1
//                                          exactly as PyTorch's clone; absent when mu = 0)
//   d = d + mu * b (Nesterov) or d = b
//   p = p - lr * d
// g is read as g x grad_scale. One fused pass per range (kernels::sgd_step;
// Optimizer::for_each_range), f32 arithmetic with the coefficients rounded once to
// f32, the parameter's copy (if any) written in the same pass.
#include <memory>

#include "kernels/optimizer.h"
#include "optim/algorithms.h"

namespace dtrain::optim::detail {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total, Device device)
      : Optimizer(
            o, std::move(s), total,
            o.momentum > 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{},
            device),
        momentum_(o.momentum == 0 ? kernels::SgdMomentum::none
                                  : (o.nesterov ? kernels::SgdMomentum::nesterov
                                                : kernels::SgdMomentum::heavy_ball)) {}

 private:
  void update(const ParamTarget& p, const Tensor& g, double lr, float grad_scale) override {
    const Tensor buf = momentum_ == kernels::SgdMomentum::none ? Tensor() : state_buffer(0);
    for_each_range([&](int32_t segment, int64_t at, int64_t n) {
      const ParamSegment& seg = segments()[static_cast<size_t>(segment)];
      if (seg.frozen) return;  // optimizer.freeze: no update, no decay, no momentum
      const kernels::SgdStep k{static_cast<float>(lr * seg.lr_scale), decay_of(segment),
                               static_cast<float>(options().momentum), momentum_, grad_scale};
      Tensor pt = param_range(p, segment, at, n), ct = copy_range(p, segment, at, n);
      Tensor bt = buf.defined() ? buf.view(at, Shape{n}) : Tensor();
      kernels::sgd_step(k, pt, g.view(at, Shape{n}), bt, ct.defined() ? &ct : nullptr);
    });
  }

  kernels::SgdMomentum momentum_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                    int64_t total, Device device) {
  return std::make_unique<Sgd>(o, std::move(s), total, device);
}

}  // namespace dtrain::optim::detail
