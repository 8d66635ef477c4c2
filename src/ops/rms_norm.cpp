// RMS normalization entries: validation, output allocation, dispatch (kernels in cpu/rms_norm.cpp).
#include "mixtrain/ops/rms_norm.h"
#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

namespace {
std::string text(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_input(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() >= 1 && x.dim(-1) > 0,
                 op << ": input must be a floating tensor with a non-empty last axis, got " << text(x));
}

// A float32 vector of n elements (scale: (D,); rstd: (rows,)).
void check_vector(const Tensor& v, int64_t n, const char* what, const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(v.defined() && v.dtype() == DType::kFloat32 && v.rank() == 1 && v.dim(0) == n,
                 op << ": " << what << " must be float32 (" << n << ",) for input " << x.describe() << ", got "
                    << text(v));
}
}  // namespace

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
