// Internal to autograd: where GradientTape::gradient() collects the gradients that backward steps give to
// variables (values not produced by a recorded operation), instead of Var::grad().
#pragma once

#include <cstddef>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mixtrain/autograd/var.h"

namespace mixtrain::detail {

struct GradientSink {
  // Outputs of the operations being replayed: their gradients stay on the Var (the replay reads them).
  std::unordered_set<const void*> intermediates;
  // Everything else reached: variable id -> gradient in the variable's dtype.
  std::unordered_map<const void*, Tensor> grads;

  bool takes(const Var& v) const { return intermediates.count(v.id()) == 0; }
  // Adds g for v; owned: no one else holds g, so the first one is kept without a copy.
  void add(const Var& v, const Tensor& g, bool owned);
};

// The sink in force on this thread while a GradientTape replays; null otherwise.
GradientSink* active_gradient_sink();
// Puts sink in force on this thread (null: none).
void set_active_gradient_sink(GradientSink* sink);

// One recorded operation of this thread's tape (tape.cpp).
struct RecordedStep {
  Var output;
  std::function<void()> backward_fn;
};
// The steps recorded at positions [start, end) of this thread's tape, in order, for a replay. Those before
// keep_from are moved out and removed from the tape; those from keep_from on are copied and stay, for a tape
// that started there and is still recording (nested tapes), so positions from keep_from on move down by
// min(keep_from, end) - start where that is positive.
std::vector<RecordedStep> take_recorded(size_t start, size_t keep_from = static_cast<size_t>(-1));
// Turns recording on or off on this thread; returns the previous mode.
bool set_grad_enabled(bool enabled);

}  // namespace mixtrain::detail
