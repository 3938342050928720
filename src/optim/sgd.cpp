// SGD with momentum (dampening 0), Nesterov and L2 weight decay, PyTorch semantics:
//   d = g + wd * p                        (wd = 0 on no_decay segments)
//   b = mu * b + d                        (state "momentum", zeroed, so b = d on step 1
//                                          exactly as PyTorch's clone; absent when mu = 0)
//   d = d + mu * b (Nesterov) or d = b
//   p = p - lr * d
// One fused pass per chunk, f32 arithmetic with the coefficients rounded once to f32.
#include <memory>

#include "core/parallel.h"
#include "optim/algorithms.h"

namespace dtrain::optim::detail {
namespace {

enum class Momentum : uint8_t { none, heavy_ball, nesterov };

struct SgdCoef {
  float lr, wd, mu;
};

void sgd_plain(float* p, const float* g, int64_t n, SgdCoef k) {
  for (int64_t i = 0; i < n; ++i) p[i] -= k.lr * (g[i] + k.wd * p[i]);
}

template <Momentum M>
void sgd_momentum(float* p, const float* g, float* buf, int64_t n, SgdCoef k) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + k.wd * p[i];
    const float b = k.mu * buf[i] + d;
    buf[i] = b;
    p[i] -= k.lr * (M == Momentum::nesterov ? d + k.mu * b : b);
  }
}

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, std::vector<ParamSegment> s, int64_t total)
      : Optimizer(
            o, std::move(s), total,
            o.momentum > 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{}),
        momentum_(o.momentum == 0 ? Momentum::none
                                  : (o.nesterov ? Momentum::nesterov : Momentum::heavy_ball)) {}

 private:
  void update(float* p, const float* g, double lr) override {
    float* buf = momentum_ == Momentum::none ? nullptr : state_data(0);
    const auto& cs = chunks();
    parallel_for(0, static_cast<int64_t>(cs.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const SegmentChunk& ch = cs[static_cast<size_t>(c)];
        const SgdCoef k{static_cast<float>(lr), decay_of(ch),
                        static_cast<float>(options().momentum)};
        const int64_t at = ch.begin, n = ch.end - ch.begin;
        if (momentum_ == Momentum::none) sgd_plain(p + at, g + at, n, k);
        if (momentum_ == Momentum::heavy_ball)
          sgd_momentum<Momentum::heavy_ball>(p + at, g + at, buf + at, n, k);
        if (momentum_ == Momentum::nesterov)
          sgd_momentum<Momentum::nesterov>(p + at, g + at, buf + at, n, k);
      }
    });
  }

  Momentum momentum_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimizerOptions& o, std::vector<ParamSegment> s,
                                    int64_t total) {
  return std::make_unique<Sgd>(o, std::move(s), total);
}

}  // namespace dtrain::optim::detail
