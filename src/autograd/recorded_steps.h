// Internal to autograd: the steps this thread's tape recorded, as GradientTape takes them for a replay. Defined
// in tape.cpp, which owns the tape.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "mixtrain/autograd/var.h"

namespace mixtrain::detail {

// One recorded operation of this thread's tape.
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
