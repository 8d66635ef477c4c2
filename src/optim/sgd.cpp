#include "mixtrain/optim/sgd.h"

#include <cmath>

namespace mixtrain {

namespace {
// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 16;
}  // namespace

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

void Sgd::update_span(float* w, const float* g, float* const* slots, int64_t n, int /*cls*/) {
  const float lr = learning_rate();
  if (momentum_ == 0.0f) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] -= g[i] * lr;
    return;
  }
  float* v = slots[0];  // "momentum"
  const float mu = momentum_;
  if (nesterov_) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = v[i] * mu - g[i] * lr;
      w[i] += v[i] * mu - g[i] * lr;
    }
  } else {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = v[i] * mu - g[i] * lr;
      w[i] += v[i];
    }
  }
}

}  // namespace mixtrain
