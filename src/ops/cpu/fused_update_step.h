// The host side of one fused update step, shared by the CPU kernel (fused_update.cpp) and the device kernels'
// reference (fused_update_reference.cpp): a step the flag skips changes nothing but, where asked, the counter; any
// other step reads its rates at the counter's place in the window.
#pragma once

#include "mixtrain/ops/fused_update.h"

namespace mixtrain::ops::cpu {

// The rates of this step, or null when found_inf is raised (the counter advanced as step says).
inline const UpdateRates* step_rates(const FusedUpdateStep& step, const Tensor* found_inf, Tensor& iterations) {
  int64_t& counter = iterations.data<int64_t>()[0];
  if (found_inf != nullptr && found_inf->data<float>()[0] != 0.0f) {
    if (step.skipped_steps_advance_iterations) ++counter;
    return nullptr;
  }
  const int64_t k = counter - step.first_iterations;
  MIXTRAIN_CHECK(k >= 0 && k < step.window, "fused_update: the counter holds " << counter << " iterations, outside the "
                                                                               << step.window << " rates from "
                                                                               << step.first_iterations);
  return &step.rates[k];
}

}  // namespace mixtrain::ops::cpu
