// The device kernels' reference of the fused update op on the CPU (ops::kernel::fused_update_reference), one
// element at a time through the shared functions (ops/shared/fused_update_element.h), as the CUDA kernel runs them.
// The op's CPU kernel is the blocked, vectorised pass (fused_update.cpp), which gives the same bits; tests install
// this one as the CPU entry to run the optimizer's device path on the CPU through the device's arithmetic.
#include "../shared/clip_factor.h"
#include "../shared/update_group_pointers.h"
#include "fused_update_step.h"
#include "mixtrain/ops/fused_update.h"

namespace mixtrain::ops::kernel {

namespace {
constexpr int64_t kParallelMin = int64_t{1} << 16;  // below this a thread team costs more than it saves
}  // namespace

void fused_update_reference(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step,
                            const Tensor* found_inf, Tensor& iterations, const Tensor* global_norm) {
  MIXTRAIN_CHECK(step.span_rule == nullptr, "fused_update_reference: a span rule has no element form");
  const UpdateRates* rates_now = cpu::step_rates(step, found_inf, iterations);
  if (rates_now == nullptr) return;
  const UpdateRates rates = *rates_now;
  const int64_t counter = iterations.data<int64_t>()[0];  // completed updates: stochastic rounding's step
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
        shared::fused_update_element(p, i, rule, c, rates.learning_rate, scaled, factor, decay, counter);
    }
  }
  ++iterations.data<int64_t>()[0];  // one more completed update
}

}  // namespace mixtrain::ops::kernel
