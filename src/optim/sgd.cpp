#include "mixtrain/optim/sgd.h"

#include <cmath>

namespace mixtrain {

Sgd::Sgd(float learning_rate, float momentum, bool nesterov)
    : Optimizer(learning_rate), momentum_(momentum), nesterov_(nesterov) {
  MIXTRAIN_CHECK(std::isfinite(momentum) && momentum >= 0.0f && momentum < 1.0f,
                 "sgd: momentum must be in [0, 1), got " << momentum);
}

std::vector<std::string> Sgd::slot_names() const {
  // Keras keeps no slot without momentum; neither do we, so plain SGD costs no memory.
  if (momentum_ == 0.0f) return {};
  return {"momentum"};
}

std::optional<ops::UpdateConstants> Sgd::fused_rule() const {
  ops::UpdateConstants k;
  k.kind = ops::UpdateKind::kSgd;
  k.momentum = momentum_;
  k.nesterov = nesterov_;
  return k;
}

void Sgd::update_span(float* w, const float* g, float* const* slots, int64_t n, int cls) {
  ops::update_span(*fused_rule(), fused_rates(learning_rate(), iterations()), w, g, slots, n, cls);
}

}  // namespace mixtrain
