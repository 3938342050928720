// The mixed-precision form of a step (optim/optimizer.h ParamTarget): the gradient
// multiplier folded into the update, the compute-dtype copies written in the same
// pass, and half parameters updated in place. Each is checked bit for bit against
// the plain f32 step it must equal: g pre-multiplied; the copy = the updated f32
// parameter rounded; the in-place half = the f32 step from the widened half, rounded.
#include <doctest/doctest.h>

#include <cstring>

#include "core/dtype.h"
#include "kernels/elementwise.h"
#include "optim/optimizer.h"
#include "reference.h"
#include "util.h"

using namespace dtrain;
using namespace dtrain::optim;
using namespace dtrain::optim::test;

namespace {

constexpr OptimizerName kAll[] = {OptimizerName::sgd, OptimizerName::adamw, OptimizerName::lamb};

// One tensor per segment of `dtype`, filled from p rounded.
std::vector<Tensor> per_segment(const std::vector<float>& p, DType dtype) {
  std::vector<Tensor> out;
  for (const ParamSegment& s : layout()) {
    Tensor t = Tensor::empty(Shape{s.size}, dtype);
    std::vector<float> part(p.begin() + s.offset, p.begin() + s.offset + s.size);
    kernels::cast(as_tensor(part), t);
    out.push_back(t);
  }
  return out;
}

bool same_tensor_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("grad_scale: the step reads g x grad_scale, bit for bit as a pre-scaled g") {
  for (OptimizerName name : kAll) {
    CAPTURE(to_string(name));
    const OptimizerOptions o = options_for(name);
    auto folded = make_optimizer(o, layout(), kTotal);
    auto plain = make_optimizer(o, layout(), kTotal);
    std::vector<float> pf = pattern(kTotal, 1), pp = pf;
    const float c = 1.0f / 4096.0f * 0.37f;  // an unscale times a clipping factor
    for (int s = 0; s < 3; ++s) {
      std::vector<float> g = pattern(kTotal, 100 + s), scaled = g;
      for (float& x : g) x *= 4096.0f;  // as a loss scale leaves them
      for (size_t i = 0; i < g.size(); ++i) scaled[i] = g[i] * c;
      folded->step(ParamTarget{as_tensor(pf), {}, {}}, as_tensor(g), 0.05, c);
      Tensor pt = as_tensor(pp);
      plain->step(pt, as_tensor(scaled), 0.05);
    }
    CHECK(same_bits(pf.data(), pp.data(), kTotal));
    CHECK(pf != pattern(kTotal, 1));
  }
}

TEST_CASE("copies: one pass updates the f32 masters and writes them rounded to each copy") {
  for (OptimizerName name : kAll) {
    CAPTURE(to_string(name));
    const OptimizerOptions o = options_for(name);
    auto with = make_optimizer(o, layout(), kTotal);
    auto without = make_optimizer(o, layout(), kTotal);
    std::vector<float> pw = pattern(kTotal, 1), pn = pw;
    // bf16, f16 and f32 copies (a half run's weights, and its f32 norm parameters)
    const DType dtypes[] = {DType::bf16, DType::f16, DType::f32};
    std::vector<Tensor> copies;
    for (size_t s = 0; s < layout().size(); ++s)
      copies.push_back(per_segment(pw, dtypes[s % 3])[s]);
    for (int s = 0; s < 3; ++s) {
      std::vector<float> g = pattern(kTotal, 100 + s);
      with->step(ParamTarget{as_tensor(pw), copies, {}}, as_tensor(g), 0.05, 0.5f);
      without->step(ParamTarget{as_tensor(pn), {}, {}}, as_tensor(g), 0.05, 0.5f);
    }
    CHECK(same_bits(pw.data(), pn.data(), kTotal));
    const std::vector<Tensor> want0 = per_segment(pn, DType::bf16);
    const std::vector<Tensor> want1 = per_segment(pn, DType::f16);
    const std::vector<Tensor> want2 = per_segment(pn, DType::f32);
    CHECK(same_tensor_bits(copies[0], want0[0]));
    CHECK(same_tensor_bits(copies[1], want1[1]));
    CHECK(same_tensor_bits(copies[2], want2[2]));
  }
}

TEST_CASE("views: half parameters stepped in place equal the f32 step from them, rounded") {
  for (OptimizerName name : {OptimizerName::sgd, OptimizerName::adamw}) {
    for (DType half : {DType::bf16, DType::f16}) {
      CAPTURE(to_string(name));
      CAPTURE(dtype_name(half));
      const OptimizerOptions o = options_for(name);
      auto in_place = make_optimizer(o, layout(), kTotal);
      auto flat = make_optimizer(o, layout(), kTotal);
      std::vector<Tensor> views = per_segment(pattern(kTotal, 1), half);
      const std::vector<Tensor> start = per_segment(pattern(kTotal, 1), half);
      for (int s = 0; s < 3; ++s) {
        std::vector<float> g = pattern(kTotal, 100 + s);
        // the reference: the views widened into a flat f32 buffer, one f32 step, rounded
        std::vector<float> p(kTotal, 0.0f);
        for (size_t i = 0; i < views.size(); ++i) {
          Tensor dst = as_tensor(p).view(layout()[i].offset, Shape{layout()[i].size});
          kernels::cast(views[i], dst);
        }
        // Both optimizers' state stays equal: it is f32 and computed from the same values.
        in_place->step(ParamTarget{{}, {}, views}, as_tensor(g), 0.05, 0.5f);
        flat->step(ParamTarget{as_tensor(p), {}, {}}, as_tensor(g), 0.05, 0.5f);
        const std::vector<Tensor> want = per_segment(p, half);
        for (size_t i = 0; i < views.size(); ++i) CHECK(same_tensor_bits(views[i], want[i]));
      }
      CHECK_FALSE(same_tensor_bits(views[2], start[2]));
    }
  }
  auto lamb = make_optimizer(options_for(OptimizerName::lamb), layout(), kTotal);
  CHECK_FALSE(lamb->steps_views());
  std::vector<float> g = pattern(kTotal, 100);
  CHECK_THROWS(lamb->step(ParamTarget{{}, {}, per_segment(pattern(kTotal, 1), DType::bf16)},
                          as_tensor(g), 0.05));
}
