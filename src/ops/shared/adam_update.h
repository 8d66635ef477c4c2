// The Adam update of one float32 element, written once for the CPU optimizer's rule (optim/adam.h, Keras'
// formulation) and a GPU kernel. Same operations in the same order as src/optim/adam.cpp, each rounded once, so
// both give the same bits (tests/ops/cuda_shared_math_test.cpp checks against the CPU Adam's update_span at every
// instruction-set level). The fused arena pass reads them through fused_update_element.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "float16_convert.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

// The per-step scalars: computed in double on the host once per update and rounded once to float32.
struct AdamCoefficients {
  float alpha = 0;  // lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = iterations + 1
  float one_minus_beta1 = 0;
  float one_minus_beta2 = 0;
  float epsilon = 0;
};

// Host only: the coefficients of the update that follows `iterations` completed ones. Adam::adam_step's
// expressions, in the same order.
inline AdamCoefficients adam_coefficients(float learning_rate, double beta1, double beta2, float epsilon,
                                          int64_t iterations) {
  const double t = static_cast<double>(iterations + 1);
  const double bias1 = 1.0 - std::pow(beta1, t);
  const double bias2 = 1.0 - std::pow(beta2, t);
  AdamCoefficients c;
  c.alpha = static_cast<float>(static_cast<double>(learning_rate) * std::sqrt(bias2) / bias1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.epsilon = epsilon;
  return c;
}

// m += (g - m) (1 - beta1);  v += (g^2 - v) (1 - beta2);  w -= (m alpha) / (sqrt(v) + epsilon)
MIXTRAIN_HOST_DEVICE inline void adam_update(float& w, float g, float& m, float& v, const AdamCoefficients& c) {
  m = add_rn(m, mul_rn(sub_rn(g, m), c.one_minus_beta1));
  v = add_rn(v, mul_rn(sub_rn(mul_rn(g, g), v), c.one_minus_beta2));
  w = sub_rn(w, div_rn(mul_rn(m, c.alpha), add_rn(sqrt_rn(v), c.epsilon)));
}

// AdamW's decoupled weight decay, applied before the Adam step: w - w * weight_decay * lr, Keras' association
// (AdamW::update_span).
MIXTRAIN_HOST_DEVICE inline float adamw_decay(float w, float weight_decay, float learning_rate) {
  return sub_rn(w, mul_rn(mul_rn(w, weight_decay), learning_rate));
}

}  // namespace mixtrain::ops::shared
