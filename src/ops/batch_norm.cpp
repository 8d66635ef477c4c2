#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/backend.h"

#include <cmath>
#include <string>

namespace mixtrain::ops {

namespace {
std::string text(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_input(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() >= 1 && x.dim(-1) > 0,
                 op << ": input must be a floating tensor with a channel axis last, got " << text(x));
}

// A float32 (C,) parameter or statistic matching x's channels.
void check_channel_vector(const Tensor& v, const Tensor& x, const char* what, const char* op) {
  MIXTRAIN_CHECK(v.defined() && v.dtype() == DType::kFloat32 && v.rank() == 1 && v.dim(0) == x.dim(-1),
                 op << ": " << what << " must be float32 (" << x.dim(-1) << ",) for input " << x.describe()
                    << ", got " << text(v));
}

// What a backward pass reads: x, its statistics and gamma, and a gradient of x's shape.
void check_backward_inputs(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                           const Tensor& gamma, const char* op) {
  check_input(x, op);
  check_channel_vector(mean, x, "mean", op);
  check_channel_vector(variance, x, "variance", op);
  check_channel_vector(gamma, x, "gamma", op);
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == x.shape(),
                 op << ": gradient " << text(dy) << " does not match the input " << x.describe());
}
}  // namespace

BatchNormStats batch_moments(const Tensor& x) {
  constexpr const char* op = "batch_moments";
  check_input(x, op);
  MIXTRAIN_CHECK(x.numel() > 0, op << ": empty batch " << x.describe() << " has no statistics");
  const Device device = common_device(op, {&x});
  BatchNormStats s{Tensor::empty({x.dim(-1)}, DType::kFloat32, device),
                   Tensor::empty({x.dim(-1)}, DType::kFloat32, device)};
  kernel_for<Op::batch_moments>(device)(x.contiguous(), s.mean, s.variance);
  return s;
}

Tensor batch_channel_sums(const Tensor& x, const Tensor& center) {
  constexpr const char* op = "batch_channel_sums";
  check_input(x, op);
  if (center.defined()) check_channel_vector(center, x, "center", op);
  const Device device = center.defined() ? common_device(op, {&x, &center}) : common_device(op, {&x});
  Tensor sums = Tensor::empty({x.dim(-1)}, DType::kFloat32, device);
  kernel_for<Op::batch_channel_sums>(device)(x.contiguous(), center.defined() ? center.contiguous() : center, sums);
  return sums;
}

Tensor batch_norm_input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                             const Tensor& gamma, float epsilon, const Tensor& sum_dy, const Tensor& sum_dy_xhat) {
  constexpr const char* op = "batch_norm_input_grad";
  check_backward_inputs(dy, x, mean, variance, gamma, op);
  check_channel_vector(sum_dy, x, "sum_dy", op);
  check_channel_vector(sum_dy_xhat, x, "sum_dy_xhat", op);
  const Device device = common_device(op, {&dy, &x, &mean, &variance, &gamma, &sum_dy, &sum_dy_xhat});
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::batch_norm_input_grad>(device)(dy.contiguous(), x.contiguous(), mean.contiguous(),
                                                variance.contiguous(), gamma.contiguous(), epsilon,
                                                sum_dy.contiguous(), sum_dy_xhat.contiguous(), dx);
  return dx;
}

BatchNormStats update_moving_statistics(const Tensor& moving_mean, const Tensor& moving_variance,
                                        const BatchNormStats& batch, float momentum, Tensor& skipped) {
  constexpr const char* op = "update_moving_statistics";
  MIXTRAIN_CHECK(moving_mean.defined() && moving_mean.dtype() == DType::kFloat32 && moving_mean.rank() == 1,
                 op << ": the moving mean must be float32 (C,), got " << text(moving_mean));
  const int64_t c = moving_mean.dim(0);
  for (const Tensor* t : {&moving_variance, &batch.mean, &batch.variance}) {
    MIXTRAIN_CHECK(t->defined() && t->dtype() == DType::kFloat32 && t->rank() == 1 && t->dim(0) == c,
                   op << ": every statistic must be float32 (" << c << ",) as the moving mean, got " << text(*t));
  }
  MIXTRAIN_CHECK(skipped.defined() && skipped.dtype() == DType::kFloat32 && skipped.numel() == 1 &&
                     skipped.is_contiguous(),
                 op << ": the skip count must be one float32, got " << text(skipped));
  MIXTRAIN_CHECK(std::isfinite(momentum), op << ": the momentum must be finite, got " << momentum);
  const Device device = common_device(op, {&moving_mean, &moving_variance, &batch.mean, &batch.variance, &skipped});
  BatchNormStats next{Tensor::empty({c}, DType::kFloat32, device), Tensor::empty({c}, DType::kFloat32, device)};
  kernel_for<Op::moving_statistics>(device)(moving_mean.contiguous(), moving_variance.contiguous(),
                                            batch.mean.contiguous(), batch.variance.contiguous(), momentum, next.mean,
                                            next.variance, skipped);
  return next;
}

Tensor batch_norm(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma,
                  const Tensor& beta, float epsilon) {
  constexpr const char* op = "batch_norm";
  check_input(x, op);
  check_channel_vector(mean, x, "mean", op);
  check_channel_vector(variance, x, "variance", op);
  check_channel_vector(gamma, x, "gamma", op);
  check_channel_vector(beta, x, "beta", op);
  MIXTRAIN_CHECK(epsilon >= 0.0f, op << ": epsilon must be non-negative, got " << epsilon);
  const Device device = common_device(op, {&x, &mean, &variance, &gamma, &beta});
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::batch_norm>(device)(x.contiguous(), mean.contiguous(), variance.contiguous(), gamma.contiguous(),
                                     beta.contiguous(), epsilon, y);
  return y;
}

BatchNormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                                   const Tensor& gamma, float epsilon, bool batch_statistics, bool need_x) {
  constexpr const char* op = "batch_norm_backward";
  check_backward_inputs(dy, x, mean, variance, gamma, op);
  const Device device = common_device(op, {&dy, &x, &mean, &variance, &gamma});
  BatchNormGrads g;
  if (need_x) g.dx = Tensor::empty(x.shape(), x.dtype(), device);
  g.dgamma = Tensor::empty({x.dim(-1)}, DType::kFloat32, device);
  g.dbeta = Tensor::empty({x.dim(-1)}, DType::kFloat32, device);
  kernel_for<Op::batch_norm_backward>(device)(dy.contiguous(), x.contiguous(), mean.contiguous(),
                                              variance.contiguous(), gamma.contiguous(), epsilon, batch_statistics,
                                              g.dx, g.dgamma, g.dbeta);
  return g;
}

}  // namespace mixtrain::ops
