#include "gradient_sink.h"

#include "mixtrain/ops/elementwise.h"

namespace mixtrain::detail {

namespace {
thread_local GradientSink* t_sink = nullptr;
}  // namespace

GradientSink* active_gradient_sink() { return t_sink; }
void set_active_gradient_sink(GradientSink* sink) { t_sink = sink; }

void GradientSink::add(const void* var_id, DType dtype, const Tensor& g, bool owned) {
  auto it = grads.find(var_id);
  if (it == grads.end()) {
    Tensor converted = g.to(dtype);
    // A gradient shared with another input (add() gives one tensor to both) is copied before it is summed into.
    if (!owned && converted.shares_storage(g)) converted = g.clone();
    grads.emplace(var_id, std::move(converted));
    return;
  }
  ops::add_into(it->second, g);  // float32 sums, rounded once into the variable's dtype (as Var::accumulate_grad)
}

}  // namespace mixtrain::detail
