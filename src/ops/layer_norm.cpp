// Layer normalization entries: validation, output allocation, dispatch (kernels in cpu/layer_norm.cpp).
#include "mixtrain/ops/layer_norm.h"
#include "mixtrain/ops/backend.h"
#include "row_norm_checks.h"

namespace mixtrain::ops {

using row_norm_checks::check_input;
using row_norm_checks::check_vector;
using row_norm_checks::text;

LayerNormOutput layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon) {
  constexpr const char* op = "layer_norm";
  check_input(x, op);
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  check_vector(gamma, d, "gamma", x, op);
  check_vector(beta, d, "beta", x, op);
  MIXTRAIN_CHECK(epsilon >= 0.0f, op << ": epsilon must be non-negative, got " << epsilon);
  const Device device = common_device(op, {&x, &gamma, &beta});
  LayerNormOutput out{Tensor::empty(x.shape(), x.dtype(), device), Tensor::empty({rows}, DType::kFloat32, device),
                      Tensor::empty({rows}, DType::kFloat32, device)};
  kernel_for<Op::layer_norm>(device)(x.contiguous(), gamma.contiguous(), beta.contiguous(), epsilon, out.y, out.mean,
                                     out.rstd);
  return out;
}

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& gamma, bool need_x) {
  constexpr const char* op = "layer_norm_backward";
  check_input(x, op);
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  check_vector(mean, rows, "mean", x, op);
  check_vector(rstd, rows, "rstd", x, op);
  check_vector(gamma, d, "gamma", x, op);
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == x.shape(),
                 op << ": gradient " << text(dy) << " does not match the input " << x.describe());
  const Device device = common_device(op, {&dy, &x, &mean, &rstd, &gamma});
  LayerNormGrads g;
  if (need_x) g.dx = Tensor::empty(x.shape(), x.dtype(), device);
  g.dgamma = Tensor::empty({d}, DType::kFloat32, device);
  g.dbeta = Tensor::empty({d}, DType::kFloat32, device);
  kernel_for<Op::layer_norm_backward>(device)(dy.contiguous(), x.contiguous(), mean.contiguous(), rstd.contiguous(),
                                              gamma.contiguous(), g.dx, g.dgamma, g.dbeta);
  return g;
}

}  // namespace mixtrain::ops
