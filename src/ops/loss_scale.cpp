#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/backend.h"

#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {

std::string describe_or_undefined(const Tensor& t) { return t.defined() ? t.describe() : "an undefined tensor"; }

void check_gradient_and_output(const char* op, const Tensor& scaled, const Tensor& out) {
  MIXTRAIN_CHECK(scaled.defined() && is_float(scaled.dtype()),
                 op << ": the gradients must be a floating tensor, got " << describe_or_undefined(scaled));
  MIXTRAIN_CHECK(out.defined() && out.dtype() == DType::kFloat32 && out.is_contiguous() &&
                     out.numel() == scaled.numel(),
                 op << ": the output " << describe_or_undefined(out)
                    << " must be contiguous float32 with the element count of " << scaled.describe());
}

void check_state(const char* op, const Tensor& t, const char* what, DType dtype, int64_t numel) {
  MIXTRAIN_CHECK(t.defined() && t.dtype() == dtype && t.numel() == numel && t.is_contiguous(),
                 op << ": " << what << " must be a contiguous " << dtype_name(dtype) << " tensor of " << numel
                    << " element(s), got " << describe_or_undefined(t));
}

}  // namespace

int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out) {
  constexpr const char* op = "unscale_and_count_nonfinite";
  check_gradient_and_output(op, scaled, out);
  const Device device = common_device(op, {&scaled, &out});
  if (scaled.numel() == 0) return 0;
  const Tensor sc = scaled.contiguous();
  return kernel_for<Op::unscale_and_count_nonfinite>(device)(sc, inv_scale, out);
}

int64_t unscale_and_count_nonfinite(Tensor& grads, float inv_scale) {
  MIXTRAIN_CHECK(grads.defined() && grads.dtype() == DType::kFloat32 && grads.is_contiguous(),
                 "unscale_and_count_nonfinite: in place needs a contiguous float32 tensor, got "
                     << describe_or_undefined(grads) << "; pass a float32 output for 16-bit gradients");
  return unscale_and_count_nonfinite(grads, inv_scale, grads);
}

void unscale_and_check(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out) {
  constexpr const char* op = "unscale_and_check";
  check_gradient_and_output(op, scaled, out);
  check_state(op, scale_state, "the scale state", DType::kFloat32, 2);
  check_state(op, found_inf, "the found_inf flag", DType::kFloat32, 1);
  const Device device = common_device(op, {&scaled, &out, &scale_state, &found_inf});
  if (scaled.numel() == 0) return;
  const Tensor sc = scaled.contiguous();
  kernel_for<Op::unscale_and_check>(device)(sc, scale_state, found_inf, out);
}

void unscale_and_check(Tensor& grads, const Tensor& scale_state, Tensor& found_inf) {
  MIXTRAIN_CHECK(grads.defined() && grads.dtype() == DType::kFloat32 && grads.is_contiguous(),
                 "unscale_and_check: in place needs a contiguous float32 tensor, got "
                     << describe_or_undefined(grads) << "; pass a float32 output for 16-bit gradients");
  unscale_and_check(grads, scale_state, found_inf, grads);
}

Tensor apply_loss_scale(const Tensor& loss, const Tensor& scale_state) {
  constexpr const char* op = "apply_loss_scale";
  MIXTRAIN_CHECK(loss.defined() && is_float(loss.dtype()),
                 op << ": the loss must be a floating-point tensor, got " << describe_or_undefined(loss));
  check_state(op, scale_state, "the scale state", DType::kFloat32, 2);
  const Device device = common_device(op, {&loss, &scale_state});
  Tensor out = Tensor::empty(loss.shape(), DType::kFloat32, device);
  if (loss.numel() == 0) return out;
  kernel_for<Op::apply_loss_scale>(device)(cast(loss, DType::kFloat32).contiguous(), scale_state, out);
  return out;
}

void update_loss_scale(Tensor& scale_state, Tensor& counters, const Tensor& found_inf, const LossScaleRule& rule) {
  constexpr const char* op = "update_loss_scale";
  check_state(op, scale_state, "the scale state", DType::kFloat32, 2);
  check_state(op, counters, "the counters", DType::kInt32, kLsNumCounters);
  check_state(op, found_inf, "the found_inf flag", DType::kFloat32, 1);
  MIXTRAIN_CHECK(rule.growth_steps >= 1 && rule.hysteresis >= 1 && rule.floor_alarm_steps >= 0 &&
                     (!rule.dynamic || (rule.min_scale > 0.0f && rule.max_scale >= rule.min_scale)),
                 op << ": invalid rule (growth_steps " << rule.growth_steps << ", hysteresis " << rule.hysteresis
                    << ", floor_alarm_steps " << rule.floor_alarm_steps << ", min_scale " << rule.min_scale
                    << ", max_scale " << rule.max_scale << ")");
  const Device device = common_device(op, {&scale_state, &counters, &found_inf});
  kernel_for<Op::update_loss_scale>(device)(scale_state, counters, found_inf, rule);
}

}  // namespace mixtrain::ops
