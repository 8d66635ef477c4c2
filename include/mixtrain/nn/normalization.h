// BatchNormalization over the last axis, as Keras' layer: normalization is prone to overflow in 16-bit
// math, so it always computes in float32 (the batch statistics included) and rounds its output once into
// the compute dtype. Under mixed policies its variables and moving statistics are float32 (the variable
// dtype).
#pragma once

#include "mixtrain/autograd/conv_functions.h"
#include "mixtrain/nn/layer.h"

namespace mixtrain {

// Training (CallContext::training): y = gamma (x - mean_B) / sqrt(var_B + epsilon) + beta with the batch's
// mean and biased variance over every axis but the last, then, as Keras,
//   moving_mean     = moving_mean * momentum + mean_B * (1 - momentum)
//   moving_variance = moving_variance * momentum + var_B * (1 - momentum)      (var_B biased, as Keras 3)
// Inference: the same with the moving statistics. gamma (ones) and beta (zeros) are trainable;
// moving_mean (zeros) and moving_variance (ones) are non-trainable variables that no optimizer touches and
// checkpoints save.
class BatchNormalization : public Layer {
 public:
  explicit BatchNormalization(float momentum = 0.99f, float epsilon = 1e-3f, DTypeArg dtype = std::nullopt);
  std::string class_name() const override { return "BatchNormalization"; }
  float momentum() const { return momentum_; }
  float epsilon() const { return epsilon_; }
  const Var& gamma() const { return gamma_; }
  const Var& beta() const { return beta_; }
  const Var& moving_mean() const { return moving_mean_; }
  const Var& moving_variance() const { return moving_variance_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  // moving = moving * momentum + batch * (1 - momentum), in float32.
  void update_moving(Var& moving, const Tensor& batch);

  float momentum_;
  float epsilon_;
  Var gamma_, beta_, moving_mean_, moving_variance_;
};

}  // namespace mixtrain
