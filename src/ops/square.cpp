// Square op entries: validation, output allocation, dispatch (kernels in cpu/square.cpp and cuda/square.cu).
#include "mixtrain/ops/square.h"

#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

Tensor square(const Tensor& x) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()),
                 "square: expected a floating tensor, got " << (x.defined() ? x.describe() : "an undefined tensor"));
  const Device device = common_device("square", {&x});
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  if (y.numel() > 0) kernel_for<Op::square>(device)(xc, y);
  return y;
}

Tensor square_backward(const Tensor& dy, const Tensor& x) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()),
                 "square_backward: expected a floating input, got " << (x.defined() ? x.describe() : "an undefined tensor"));
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == x.shape(),
                 "square_backward: gradient " << (dy.defined() ? dy.describe() : "(undefined)") << " vs input "
                                              << x.describe() << " (expected a floating tensor of the input's shape)");
  const Device device = common_device("square_backward", {&dy, &x});
  const Tensor dyc = dy.contiguous(), xc = x.contiguous();
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), device);
  if (dx.numel() > 0) kernel_for<Op::square_backward>(device)(dyc, xc, dx);
  return dx;
}

}  // namespace mixtrain::ops
