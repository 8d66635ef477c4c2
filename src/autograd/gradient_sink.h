// Internal to autograd: where GradientTape::gradient() collects the gradients that backward steps give to
// variables (values not produced by a recorded operation), instead of Var::grad(). A variable is known here by
// its Var::id() alone, so Var can hand its gradient to the sink without the sink knowing Var.
#pragma once

#include <unordered_map>
#include <unordered_set>

#include "mixtrain/core/tensor.h"

namespace mixtrain::detail {

struct GradientSink {
  // Outputs of the operations being replayed: their gradients stay on the Var (the replay reads them).
  std::unordered_set<const void*> intermediates;
  // Everything else reached: variable id -> gradient in the variable's dtype.
  std::unordered_map<const void*, Tensor> grads;

  bool takes(const void* var_id) const { return intermediates.count(var_id) == 0; }
  // Adds g for the variable var_id, whose dtype is dtype; owned: no one else holds g, so the first one is kept
  // without a copy.
  void add(const void* var_id, DType dtype, const Tensor& g, bool owned);
};

// The sink in force on this thread while a GradientTape replays; null otherwise.
GradientSink* active_gradient_sink();
// Puts sink in force on this thread (null: none).
void set_active_gradient_sink(GradientSink* sink);

}  // namespace mixtrain::detail
