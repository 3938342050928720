// The non-virtual checks around every op call.
#include "graph/op.h"

namespace dtrain::graph {

void op_error(std::string_view kind, const std::string& message) {
  throw Error(fmt::format("op {}: {}", kind, message));
}

OpInfo Op::infer(std::span<const TensorSpec> inputs) const {
  if (static_cast<int>(inputs.size()) != num_inputs()) {
    op_error(kind(), fmt::format("takes {} inputs, got {}", num_inputs(), inputs.size()));
  }
  return do_infer(inputs);
}

void Op::forward(OpContext& ctx) const {
  DTRAIN_CHECK(static_cast<int>(ctx.inputs.size()) == num_inputs(), "{}: {} inputs", kind(),
               ctx.inputs.size());
  for (const Tensor& t : ctx.inputs) DTRAIN_CHECK(t.defined(), "{}: undefined input", kind());
  for (const Tensor& t : ctx.outputs) DTRAIN_CHECK(t.defined(), "{}: undefined output", kind());
  do_forward(ctx);
}

void Op::backward(OpContext& ctx) const {
  DTRAIN_CHECK(ctx.grad_inputs.size() == ctx.inputs.size(), "{}: grad_inputs", kind());
  DTRAIN_CHECK(ctx.grad_params.size() == ctx.params.size(), "{}: grad_params", kind());
  // Every floating output has a gradient (zeros where the loss ignores it);
  // integer outputs (gathered labels) have none.
  for (size_t i = 0; i < ctx.grad_outputs.size(); ++i) {
    DTRAIN_CHECK(ctx.grad_outputs[i].defined() || !is_floating(ctx.outputs[i].dtype()),
                 "{}: undefined grad for output {}", kind(), i);
  }
  for (size_t k = 0; k < ctx.grad_params.size(); ++k) {
    DTRAIN_CHECK(ctx.grad_params[k].defined() || (skips_param_grad(k) && !ctx.accumulates(k)),
                 "{}: undefined grad for param {}", kind(), k);
  }
  do_backward(ctx);
}

}  // namespace dtrain::graph
