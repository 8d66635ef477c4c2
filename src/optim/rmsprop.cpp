#include "mixtrain/optim/rmsprop.h"

#include <cmath>


namespace mixtrain {

RMSprop::RMSprop(float learning_rate, RMSpropOptions options) : Optimizer(learning_rate), options_(options) {
  MIXTRAIN_CHECK(options.rho >= 0.0 && options.rho < 1.0, "rmsprop: rho must be in [0, 1), got " << options.rho);
  MIXTRAIN_CHECK(options.momentum >= 0.0 && options.momentum < 1.0,
                 "rmsprop: momentum must be in [0, 1), got " << options.momentum);
  MIXTRAIN_CHECK(std::isfinite(options.epsilon) && options.epsilon > 0.0f,
                 "rmsprop: epsilon must be finite and > 0, got " << options.epsilon);
}

std::vector<std::string> RMSprop::slot_names() const {
  // Keras creates the momentum and average-gradient variables only when they are used; so do we.
  std::vector<std::string> names{"velocity"};
  if (options_.momentum > 0.0) names.emplace_back("momentum");
  if (options_.centered) names.emplace_back("average_gradient");
  return names;
}

std::optional<ops::UpdateConstants> RMSprop::fused_rule() const {
  // update_span()'s constants, rounded as there.
  ops::UpdateConstants k;
  k.kind = ops::UpdateKind::kRmsprop;
  k.epsilon = options_.epsilon;
  k.momentum = static_cast<float>(options_.momentum);
  k.rho = static_cast<float>(options_.rho);
  k.one_minus_rho = static_cast<float>(1.0 - options_.rho);
  k.centered = options_.centered;
  return k;
}

void RMSprop::update_span(float* w, const float* g, float* const* slots, int64_t n, int cls) {
  ops::update_span(*fused_rule(), fused_rates(learning_rate(), iterations()), w, g, slots, n, cls);
}

}  // namespace mixtrain
