#include "mixtrain/nn/normalization.h"

namespace mixtrain {

BatchNormalization::BatchNormalization(float momentum, float epsilon, DTypeArg dtype)
    : Layer("batch_normalization", std::move(dtype)), momentum_(momentum), epsilon_(epsilon) {
  MIXTRAIN_CHECK(momentum >= 0.0f && momentum <= 1.0f, "BatchNormalization: momentum must be in [0, 1], got " << momentum);
  MIXTRAIN_CHECK(epsilon > 0.0f, "BatchNormalization: epsilon must be positive, got " << epsilon);
}

void BatchNormalization::build_impl(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0,
                 "BatchNormalization '" << name() << "' needs a channel axis last, got per-sample shape " << input_shape);
  const Shape c{input_shape[-1]};
  gamma_ = add_weight("gamma", c, Initializer::kOnes, rng);
  beta_ = add_weight("beta", c, Initializer::kZeros, rng);
  // Saved in checkpoints, never optimized, never given a gradient; the variable dtype (float32 under the
  // mixed policies).
  moving_mean_ = add_non_trainable_weight("moving_mean", c, Initializer::kZeros, rng);
  moving_variance_ = add_non_trainable_weight("moving_variance", c, Initializer::kOnes, rng);
}

Var BatchNormalization::call(const Var& x, const CallContext& ctx) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == gamma_.shape()[0],
                 "BatchNormalization '" << name() << "' was built for " << gamma_.shape()[0] << " channels, got "
                                        << x.value().describe());
  // float32 math whatever the policy: the parameters are read in float32 (their gradient is converted
  // back when a pure 16-bit policy stores them in 16 bits).
  const Var gamma = gamma_.dtype() == DType::kFloat32 ? gamma_ : cast(gamma_, DType::kFloat32);
  const Var beta = beta_.dtype() == DType::kFloat32 ? beta_ : cast(beta_, DType::kFloat32);
  BatchNormOutput out = batch_norm(x, gamma, beta, moving_mean_.value().to(DType::kFloat32),
                                   moving_variance_.value().to(DType::kFloat32), epsilon_, ctx.training);
  if (ctx.training) {
    update_moving(moving_mean_, out.batch.mean);
    update_moving(moving_variance_, out.batch.variance);
  }
  return out.y;
}

void BatchNormalization::update_moving(Var& moving, const Tensor& batch) {
  const Tensor old = moving.value().to(DType::kFloat32);
  Tensor next = Tensor::empty(old.shape(), DType::kFloat32);
  const float* o = old.data<float>();
  const float* b = batch.data<float>();
  float* n = next.data<float>();
  for (int64_t i = 0; i < next.numel(); ++i) n[i] = o[i] * momentum_ + b[i] * (1.0f - momentum_);
  moving.set_value(next);  // converted to the variable dtype; bumps the version
}

}  // namespace mixtrain
