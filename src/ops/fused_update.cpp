#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/backend.h"

#include <cmath>
#include <string>

#include "shared/adam_update.h"
#include "shared/clip_factor.h"

namespace mixtrain::ops {

namespace cpu {
// The CPU backend's update loops on host spans (src/ops/cpu/update_spans.cpp): host memory only, no device to
// dispatch on.
void update_span(const UpdateConstants& rule, const UpdateRates& rates, float* value, const float* grad,
                 float* const* slots, int64_t n, int cls);
}  // namespace cpu

namespace {

std::string describe_or_undefined(const Tensor& t) { return t.defined() ? t.describe() : "an undefined tensor"; }

bool flat(const Tensor& t, int64_t n) { return t.defined() && t.rank() == 1 && t.numel() == n && t.is_contiguous(); }

}  // namespace

int slot_count(const UpdateConstants& rule) {
  switch (rule.kind) {
    case UpdateKind::kAdam:
      return rule.kahan_summation ? 3 : 2;
    case UpdateKind::kSgd:
      return rule.momentum > 0 ? 1 : 0;
    case UpdateKind::kRmsprop:
      return 1 + (rule.momentum > 0 ? 1 : 0) + (rule.centered ? 1 : 0);
  }
  MIXTRAIN_FAIL(kInternal, "slot_count: unknown update kind " << static_cast<int>(rule.kind), "");
}

void fused_update(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step, const Tensor* found_inf,
                  Tensor& iterations, const Tensor* global_norm) {
  constexpr const char* op = "fused_update";
  MIXTRAIN_CHECK(step.window >= 1 && step.window <= kRateWindow && step.first_iterations >= 0,
                 op << ": a window of " << step.window << " rates from iteration " << step.first_iterations
                    << " (1 to " << kRateWindow << " rates, from iteration 0 or later)");
  MIXTRAIN_CHECK(step.span_rule == nullptr || static_cast<bool>(step.span_rule->update),
                 op << ": the span rule has no update function");
  const int slots = step.span_rule != nullptr ? step.span_rule->slots : slot_count(step.rule);
  MIXTRAIN_CHECK(!step.rule.bfloat16_state || (step.span_rule == nullptr && step.rule.kind == UpdateKind::kAdam),
                 op << ": bfloat16 optimizer state is Adam's (a span rule and the other rules keep float32 slots)");
  MIXTRAIN_CHECK(!step.rule.kahan_summation || (step.span_rule == nullptr && step.rule.kind == UpdateKind::kAdam &&
                                                 !step.rule.stochastic_rounding),
                 op << ": Kahan compensation is Adam's, and rounds to nearest (not with stochastic rounding)");
  const DType moment_dtype = step.rule.bfloat16_state ? DType::kBFloat16 : DType::kFloat32;
  MIXTRAIN_CHECK(iterations.defined() && iterations.dtype() == DType::kInt64 && iterations.numel() == 1 &&
                     iterations.is_contiguous(),
                 op << ": the iteration counter must be one int64, got " << describe_or_undefined(iterations));
  if (found_inf != nullptr) {
    MIXTRAIN_CHECK(found_inf->defined() && found_inf->dtype() == DType::kFloat32 && found_inf->numel() == 1,
                   op << ": the skip flag must be one float32, got " << describe_or_undefined(*found_inf));
  }
  MIXTRAIN_CHECK(std::isfinite(step.clip_norm) && step.clip_norm >= 0,
                 op << ": the clip norm must be finite and >= 0 (0: no clipping), got " << step.clip_norm);
  MIXTRAIN_CHECK((global_norm != nullptr) == (step.clip_norm > 0),
                 op << ": a global norm is read exactly when clipping (clip norm " << step.clip_norm << ", "
                    << (global_norm != nullptr ? "a norm given" : "no norm given") << ")");
  if (global_norm != nullptr) {
    MIXTRAIN_CHECK(global_norm->defined() && global_norm->dtype() == DType::kFloat32 && global_norm->numel() == 1,
                   op << ": the global norm must be one float32, got " << describe_or_undefined(*global_norm));
  }
  const Device device = common_device(op, {&iterations, found_inf, global_norm});
  if (step.span_rule != nullptr && !device.is_cpu()) {
    MIXTRAIN_FAIL(kInvalidInput, op << ": a span rule (an optimizer's own update) runs on the CPU, not on " << device.str(),
                  "give the optimizer a fused rule (UpdateConstants) to update an arena on a device");
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const FusedUpdateGroup& g = groups[gi];
    const int64_t n = g.values.defined() ? g.values.numel() : 0;
    MIXTRAIN_CHECK(flat(g.values, n) && is_float(g.values.dtype()),
                   op << ": group " << gi << ": the values must be a 1-D contiguous floating tensor, got "
                      << describe_or_undefined(g.values));
    MIXTRAIN_CHECK(flat(g.grads, n) && (g.grads.dtype() == DType::kFloat32 || g.grads.dtype() == g.values.dtype()),
                   op << ": group " << gi << ": the gradients " << describe_or_undefined(g.grads)
                      << " must be 1-D contiguous float32 or " << dtype_name(g.values.dtype()) << " with " << n
                      << " elements");
    MIXTRAIN_CHECK(static_cast<int>(g.slots.size()) == slots,
                   op << ": group " << gi << ": " << g.slots.size() << " slots given, the rule reads " << slots);
    for (size_t s = 0; s < g.slots.size(); ++s) {
      const Tensor& t = g.slots[s];
      const DType slot_dtype = s == 2 && step.rule.kahan_summation ? DType::kBFloat16 : moment_dtype;
      MIXTRAIN_CHECK(flat(t, n) && t.dtype() == slot_dtype,
                     op << ": group " << gi << ": the slot " << describe_or_undefined(t) << " must be 1-D contiguous "
                        << dtype_name(slot_dtype) << " with " << n << " elements");
    }
    MIXTRAIN_CHECK(g.copies.size() <= 2 && (g.copies.empty() || g.values.dtype() == DType::kFloat32),
                   op << ": group " << gi << ": " << g.copies.size() << " compute copies of "
                      << dtype_name(g.values.dtype()) << " values (at most a float16 and a bfloat16 copy of float32)");
    for (const Tensor& c : g.copies) {
      MIXTRAIN_CHECK(flat(c, n) && (c.dtype() == DType::kFloat16 || c.dtype() == DType::kBFloat16),
                     op << ": group " << gi << ": the compute copy " << describe_or_undefined(c)
                        << " must be 1-D contiguous float16 or bfloat16 with " << n << " elements");
    }
    MIXTRAIN_CHECK(g.run_count >= 0 && g.runs.defined() && g.runs.dtype() == DType::kInt64 && g.runs.rank() == 2 &&
                       g.runs.dim(0) == g.run_count && g.runs.dim(1) == 3 && g.runs.is_contiguous(),
                   op << ": group " << gi << ": the runs must be int64 (" << g.run_count << ", 3), got "
                      << describe_or_undefined(g.runs));
    std::vector<const Tensor*> tensors = {&g.values, &g.grads, &g.runs};
    for (const Tensor& t : g.slots) tensors.push_back(&t);
    for (const Tensor& c : g.copies) tensors.push_back(&c);
    for (const Tensor* t : tensors) {
      MIXTRAIN_CHECK(t->device() == device, op << ": group " << gi << ": " << t->describe() << " is not on "
                                               << device.str() << " with the iteration counter");
    }
  }
  kernel_for<Op::fused_update>(device)(groups, step, found_inf, iterations, global_norm);
}

void update_span(const UpdateConstants& rule, const UpdateRates& rates, float* value, const float* grad,
                 float* const* slots, int64_t n, int cls) {
  MIXTRAIN_CHECK(n >= 0, "update_span: " << n << " elements");
  if (n == 0) return;
  cpu::update_span(rule, rates, value, grad, slots, n, cls);
}

UpdateConstants adam_constants(double beta1, double beta2, float epsilon) {
  const shared::AdamCoefficients c = shared::adam_coefficients(0.0f, beta1, beta2, epsilon, 0);
  UpdateConstants k;
  k.kind = UpdateKind::kAdam;
  k.one_minus_beta1 = c.one_minus_beta1;
  k.one_minus_beta2 = c.one_minus_beta2;
  k.epsilon = c.epsilon;
  return k;
}

float adam_alpha(float learning_rate, double beta1, double beta2, int64_t iterations) {
  return shared::adam_coefficients(learning_rate, beta1, beta2, 0.0f, iterations).alpha;
}

bool clip_factor(float norm, float clip_norm, float* factor) { return shared::clip_factor(norm, clip_norm, factor); }

}  // namespace mixtrain::ops
