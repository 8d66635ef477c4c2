// The device kernels' reference of the fused update op on the CPU (ops::kernel::fused_update_reference), one
// element at a time through the shared functions (ops/shared/fused_update_element.h), as the CUDA kernel runs them.
// The op's CPU kernel is the blocked, vectorised pass (fused_update.cpp), which gives the same bits; tests install
// this one as the CPU entry to run the optimizer's device path on the CPU through the device's arithmetic.
#include "../shared/clip_factor.h"
#include "../shared/update_group_pointers.h"
#include "mixtrain/ops/fused_update.h"

namespace mixtrain::ops::kernel {

namespace {
constexpr int64_t kParallelMin = int64_t{1} << 16;  // below this a thread team costs more than it saves
}  // namespace

void fused_update_reference(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step,
                            const Tensor* found_inf, Tensor& iterations, const Tensor* global_norm) {
  MIXTRAIN_CHECK(step.span_rule == nullptr, "fused_update_reference: a span rule has no element form");
  int64_t& counter = iterations.data<int64_t>()[0];
  if (found_inf != nullptr && found_inf->data<float>()[0] != 0.0f) {
    if (step.skipped_steps_advance_iterations) ++counter;
    return;
  }
  const int64_t k = counter - step.first_iterations;
  MIXTRAIN_CHECK(k >= 0 && k < step.window, "fused_update: the counter holds " << counter << " iterations, outside the "
                                                                               << step.window << " rates from "
                                                                               << step.first_iterations);
  const UpdateRates rates = step.rates[k];
  const UpdateConstants& rule = step.rule;
  const shared::AdamCoefficients c{rates.alpha, rule.one_minus_beta1, rule.one_minus_beta2, rule.epsilon};
  float factor = 1.0f;
  const bool scaled =
      global_norm != nullptr && shared::clip_factor(global_norm->data<float>()[0], step.clip_norm, &factor);
  for (FusedUpdateGroup& g : groups) {
    const shared::UpdateGroupPointers p = shared::update_group_pointers(g);
    const int64_t* runs = g.runs.data<int64_t>();  // (run_count, 3): begin, count, class
    for (int64_t r = 0; r < g.run_count; ++r) {
      const int64_t begin = runs[3 * r], count = runs[3 * r + 1];
      const bool decay = runs[3 * r + 2] == 1;
#pragma omp parallel for if (count >= kParallelMin) schedule(static)
      for (int64_t i = begin; i < begin + count; ++i)
        shared::fused_update_element(p, i, rule, c, rates.learning_rate, scaled, factor, decay);
    }
  }
  ++counter;
}

}  // namespace mixtrain::ops::kernel
