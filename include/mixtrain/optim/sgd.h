// SGD with optional (Nesterov) momentum, Keras semantics:
//   momentum == 0:  w -= lr * g
//   momentum > 0:   v = momentum * v - lr * g;  w += v                      (slot "momentum" holds v)
//   nesterov:       v = momentum * v - lr * g;  w += momentum * v - lr * g
#pragma once

#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

class Sgd : public Optimizer {
 public:
  // momentum in [0, 1); nesterov requires nothing extra (with momentum 0 it equals plain SGD).
  explicit Sgd(float learning_rate = 0.01f, float momentum = 0.0f, bool nesterov = false);

  std::string name() const override { return "sgd"; }
  float momentum() const { return momentum_; }
  bool nesterov() const { return nesterov_; }

 protected:
  void update_span(float* value, const float* grad, float* const* slots, int64_t n, int cls) override;
  bool updates_spans() const override { return true; }
  std::vector<std::string> slot_names() const override;
  std::optional<ops::UpdateConstants> fused_rule() const override;

 private:
  float momentum_;
  bool nesterov_;
};

}  // namespace mixtrain
