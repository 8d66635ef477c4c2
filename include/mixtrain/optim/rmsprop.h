// RMSprop, Keras formulation (epsilon inside the square root; plain, not Nesterov, momentum):
//   velocity = rho * velocity + (1 - rho) * g^2                                   (slot "velocity")
//   centered: average_gradient = rho * average_gradient + (1 - rho) * g           (slot "average_gradient")
//             denominator = velocity - average_gradient^2 + epsilon
//   else:     denominator = velocity + epsilon
//   increment = lr * g / sqrt(denominator)
//   momentum > 0: m = momentum * m + increment; w -= m                            (slot "momentum")
//   else:         w -= increment
// Scalars (rho, 1 - rho, momentum) are computed in double and rounded once to float32, as Keras casts its
// Python floats; per-element math is float32 in Keras' order of operations.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

struct RMSpropOptions {
  // Doubles, so 1 - rho rounds to float32 the way Keras's Python floats do (1 - 0.9 -> 0.1f).
  double rho = 0.9;       // discounting factor of the squared-gradient average, in [0, 1)
  double momentum = 0.0;  // in [0, 1); 0 keeps no momentum slot
  float epsilon = 1e-7f;  // > 0; Keras default
  bool centered = false;  // normalise by the estimated variance (one more slot)
};

class RMSprop : public Optimizer {
 public:
  explicit RMSprop(float learning_rate = 0.001f, RMSpropOptions options = {});

  std::string name() const override { return "rmsprop"; }
  const RMSpropOptions& options() const { return options_; }

 protected:
  void update_span(float* value, const float* grad, float* const* slots, int64_t n, int cls) override;
  bool updates_spans() const override { return true; }
  // "velocity", then "momentum" when momentum > 0, then "average_gradient" when centered (Keras' variables).
  std::vector<std::string> slot_names() const override;
  std::optional<ops::UpdateConstants> fused_rule() const override;

 private:
  RMSpropOptions options_;
};

}  // namespace mixtrain
