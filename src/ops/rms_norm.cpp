// RMS normalization entries: validation, output allocation, dispatch (kernels in cpu/rms_norm.cpp).
#include "mixtrain/ops/rms_norm.h"
#include "mixtrain/ops/backend.h"
#include "row_norm_checks.h"

namespace mixtrain::ops {

using row_norm_checks::check_input;
using row_norm_checks::check_vector;
using row_norm_checks::text;

RmsNormOutput rms_norm(const Tensor& x, const Tensor& scale, float epsilon) {
  constexpr const char* op = "rms_norm";
  check_input(x, op);
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  check_vector(scale, d, "scale", x, op);
  MIXTRAIN_CHECK(epsilon >= 0.0f, op << ": epsilon must be non-negative, got " << epsilon);
  const Device device = common_device(op, {&x, &scale});
  RmsNormOutput out{Tensor::empty(x.shape(), x.dtype(), device), Tensor::empty({rows}, DType::kFloat32, device)};
  kernel_for<Op::rms_norm>(device)(x.contiguous(), scale.contiguous(), epsilon, out.y, out.rstd);
  return out;
}

RmsNormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& scale,
                               bool need_x) {
  constexpr const char* op = "rms_norm_backward";
  check_input(x, op);
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  check_vector(rstd, rows, "rstd", x, op);
  check_vector(scale, d, "scale", x, op);
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == x.shape(),
                 op << ": gradient " << text(dy) << " does not match the input " << x.describe());
  const Device device = common_device(op, {&dy, &x, &rstd, &scale});
  RmsNormGrads g;
  if (need_x) g.dx = Tensor::empty(x.shape(), x.dtype(), device);
  g.dscale = Tensor::empty({d}, DType::kFloat32, device);
  kernel_for<Op::rms_norm_backward>(device)(dy.contiguous(), x.contiguous(), rstd.contiguous(), scale.contiguous(),
                                            g.dx, g.dscale);
  return g;
}

}  // namespace mixtrain::ops
