#include "mixtrain/optim/adam.h"

#include <cmath>

namespace mixtrain {

Adam::Adam(float learning_rate, AdamOptions options) : Optimizer(learning_rate), options_(options) {
  MIXTRAIN_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "adam: beta1 must be in [0, 1), got " << options.beta1);
  MIXTRAIN_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "adam: beta2 must be in [0, 1), got " << options.beta2);
  MIXTRAIN_CHECK(std::isfinite(options.epsilon) && options.epsilon > 0.0f,
                 "adam: epsilon must be finite and > 0, got " << options.epsilon);
  MIXTRAIN_CHECK(options.optimizer_state == DType::kFloat32 || options.optimizer_state == DType::kBFloat16,
                 "adam: optimizer_state must be float32 or bfloat16, got " << dtype_name(options.optimizer_state));
  MIXTRAIN_CHECK(!(options.kahan_summation && options.stochastic_rounding),
                 "adam: kahan_summation and stochastic_rounding are two ways to round bfloat16 master weights; "
                 "choose one");
}

std::vector<std::string> Adam::slot_names() const {
  if (options_.kahan_summation) return {"m", "v", "kahan"};
  return {"m", "v"};
}

void Adam::update_span(float* value, const float* grad, float* const* slots, int64_t n, int /*cls*/) {
  adam_step(value, grad, slots[0], slots[1], n);
}

std::optional<ops::UpdateConstants> Adam::fused_rule() const {
  ops::UpdateConstants rule = ops::adam_constants(options_.beta1, options_.beta2, options_.epsilon);
  rule.stochastic_rounding = options_.stochastic_rounding;
  rule.rounding_seed = options_.rounding_seed;
  rule.bfloat16_state = options_.optimizer_state == DType::kBFloat16;
  rule.kahan_summation = options_.kahan_summation;
  return rule;
}

ops::UpdateRates Adam::fused_rates(float lr, int64_t iterations) const {
  return {ops::adam_alpha(lr, options_.beta1, options_.beta2, iterations), lr};
}

void Adam::adam_step(float* w, const float* g, float* m, float* v, int64_t n) {
  // Adam's constants and this step's rates (the scalars in double, rounded once), without AdamW's decay.
  float* slots[2] = {m, v};
  ops::update_span(*Adam::fused_rule(), Adam::fused_rates(learning_rate(), iterations()), w, g, slots, n, 0);
}

AdamW::AdamW(float learning_rate, float weight_decay, AdamOptions options,
             std::vector<std::string> exclude_from_weight_decay)
    : Adam(learning_rate, options), weight_decay_(weight_decay), exclude_(std::move(exclude_from_weight_decay)) {
  MIXTRAIN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0f,
                 "adamw: weight_decay must be finite and >= 0, got " << weight_decay);
}

std::optional<ops::UpdateConstants> AdamW::fused_rule() const {
  std::optional<ops::UpdateConstants> rule = Adam::fused_rule();
  rule->weight_decay = weight_decay_;
  return rule;
}

int AdamW::update_class(const std::string& var_key) const {
  if (weight_decay_ == 0.0f) return 0;
  for (const std::string& s : exclude_) {
    if (var_key.find(s) != std::string::npos) return 0;
  }
  return 1;
}

void AdamW::update_span(float* w, const float* g, float* const* slots, int64_t n, int cls) {
  // Class 1 decays first (w - w * weight_decay * lr, Keras' association), then the Adam step.
  ops::update_span(*fused_rule(), fused_rates(learning_rate(), iterations()), w, g, slots, n, cls);
}

}  // namespace mixtrain
