// SGD with momentum (dampening 0), Nesterov and L2 weight decay, PyTorch semantics:
//   d = g + wd * p                        (wd = 0 on no_decay segments)
//   b = mu * b + d                        (state "momentum", zeroed, so b = d on step 1
//                                          exactly as PyTorch's clone; absent when mu = 0)
//   d = d + mu * b (Nesterov) or d = b
//   p = p - lr * d
// One fused pass per chunk (kernels::sgd_step), f32 arithmetic with the coefficients
// rounded once to f32.
#include <memory>

#include "core/parallel.h"
#include "kernels/optimizer.h"
#include "optim/algorithms.h"

namespace dtrain::optim::detail {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total)
      : Optimizer(
            o, std::move(s), total,
            o.momentum > 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{}),
        momentum_(o.momentum == 0 ? kernels::SgdMomentum::none
                                  : (o.nesterov ? kernels::SgdMomentum::nesterov
                                                : kernels::SgdMomentum::heavy_ball)) {}

 private:
  void update(float* p, const float* g, double lr) override {
    float* buf = momentum_ == kernels::SgdMomentum::none ? nullptr : state_data(0);
    const auto& cs = chunks();
    parallel_for(0, static_cast<int64_t>(cs.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const SegmentChunk& ch = cs[static_cast<size_t>(c)];
        const kernels::SgdStep k{static_cast<float>(lr), decay_of(ch),
                                 static_cast<float>(options().momentum), momentum_};
        const int64_t at = ch.begin, n = ch.end - ch.begin;
        Tensor pt = chunk_view(p, at, n), bt = buf ? chunk_view(buf, at, n) : Tensor();
        kernels::sgd_step(k, pt, chunk_view(g, at, n), bt);
      }
    });
  }

  kernels::SgdMomentum momentum_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                    int64_t total) {
  return std::make_unique<Sgd>(o, std::move(s), total);
}

}  // namespace dtrain::optim::detail
